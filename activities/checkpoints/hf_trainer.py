"""Hugging Face Trainer's ``checkpoint-N/`` directories (``transformers`` ``Trainer._save_checkpoint``).

The Trainer writes the weights, then optimizer, scheduler and RNG states, and ``trainer_state.json`` last (process
0), so that file is the completion marker; ``get_last_checkpoint`` itself takes the highest ``checkpoint-N`` with no
check at all. Complete here means: ``trainer_state.json`` parses and names its ``global_step``, the weights are
complete (``weights.weights_problem``: every shard of the safetensors index present, sound and holding its
tensors, or a sharded FSDP save in ``pytorch_model_fsdp_*/``), and no ``*.pt``/``*.pth``/``*.bin`` state file is
empty or cut short.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from activities.checkpoints.dcp import check_dcp
from activities.checkpoints.files import (
    Candidate,
    find_step_dirs,
    incomplete,
    json_file,
    leftover_tmp,
    modified_at,
    problem_or_valid,
    torch_save_problem,
)
from activities.checkpoints.weights import weights_problem
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus

__all__ = ["TRAINER_STATE", "find"]

_FMT = CheckpointFormat.HF_TRAINER
_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
_STATE_SUFFIXES = (".pt", ".pth", ".bin")


def find(root: Path, names: list[str]) -> tuple[list[Candidate], set[str]]:
    """The Trainer's checkpoints among ``names`` (entries of ``root``), and the names it claims."""
    return find_step_dirs(root, names, _DIR, _FMT, _check)


def _check(path: Path, step: int) -> Candidate:
    tmp = leftover_tmp(path)
    if tmp:
        return incomplete(path, _FMT, step, f"{tmp[0]} left over: a save was interrupted")
    try:
        state = json_file(path / TRAINER_STATE)
    except FileNotFoundError:
        return incomplete(path, _FMT, step, f"no {TRAINER_STATE} (the Trainer writes it last: the save did not finish)")
    except ValueError as e:
        return incomplete(path, _FMT, step, str(e))
    global_step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(global_step, int) or isinstance(global_step, bool):
        return incomplete(path, _FMT, step, f"{TRAINER_STATE} has no global_step")
    names = sorted(os.listdir(path))
    fsdp = [n for n in names if n.startswith("pytorch_model_fsdp") and (path / n).is_dir()]
    if fsdp:
        for n in fsdp:
            sharded = check_dcp(path / n, _FMT, global_step)
            if sharded.status is not CheckpointStatus.VALID:
                return incomplete(path, _FMT, global_step, f"{n}: {sharded.reason}")
        problem = None
    else:
        problem = weights_problem(path)
    for n in names:
        if problem is None and n.endswith(_STATE_SUFFIXES) and not n.startswith(("pytorch_model", "adapter_model")):
            problem = torch_save_problem(path / n)
    return problem_or_valid(
        path,
        _FMT,
        global_step,
        problem,
        f"{TRAINER_STATE} at step {global_step}, weights complete",
        modified_at(path / TRAINER_STATE),
    )
