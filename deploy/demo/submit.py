"""Submitting the demo training job to the lab's Slurm (``train.sbatch`` through ``sbatch --parsable``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from deploy.demo.common import RunPaths
from deploy.local.layout import LabLayout

SBATCH_SCRIPT = Path(__file__).with_name("train.sbatch")
#: The same trainer launched by torchrun under srun (one task per node), writing only ``slurm-%j.out``.
TORCHRUN_SBATCH_SCRIPT = Path(__file__).with_name("train-torchrun.sbatch")
LAUNCHERS = ("srun", "torchrun")
# The lab's trainers, by name: the demo loop, and real PyTorch Lightning and Hugging Face Trainer jobs (the trainers
# extra). Every script takes the same trainer options and writes the same per-rank logs and rank files.
TRAINER_SCRIPTS = {
    "demo": SBATCH_SCRIPT,
    "lightning": Path(__file__).with_name("train_lightning.sbatch"),
    "hf": Path(__file__).with_name("train_hf.sbatch"),
}
# The directory holding the `deploy` package: the ranks run `python -m deploy.demo.train` from the run directory.
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STEPS = 2000
DEFAULT_CHECKPOINT_EVERY = 20
DEFAULT_STEP_SLEEP = 0.1
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class SubmitError(RuntimeError):
    """sbatch refused the job or answered something that is not a job id."""


def validate_run_name(run: str) -> str:
    """A run name becomes a directory and part of the job name: one plain path component."""
    if not _RUN_NAME.match(run):
        raise ValueError(f"invalid run name {run!r}: use 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
    return run


def sbatch_command(
    layout: LabLayout,
    run: str,
    *,
    nodes: int = 2,
    tasks_per_node: int = 2,
    gpus_per_node: int = 2,
    steps: int = DEFAULT_STEPS,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    step_sleep: float = DEFAULT_STEP_SLEEP,
    extra_sbatch_args: Sequence[str] = (),
    sbatch: str = "sbatch",
    launcher: str = "srun",
    trainer: str = "demo",
) -> list[str]:
    """The argument list ``submit_demo`` runs (exposed for dry runs and tests).

    ``launcher="torchrun"``: one srun task per node, ``tasks_per_node`` torchrun workers on each, and the job's
    output left at Slurm's default, ``slurm-%j.out`` in the run directory (``torchrun_log``). ``trainer``: the
    demo loop or a real trainer (``TRAINER_SCRIPTS``); torchrun launches the demo loop only.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if trainer not in TRAINER_SCRIPTS:
        raise ValueError(f"unknown trainer {trainer!r}: one of {', '.join(TRAINER_SCRIPTS)}")
    if launcher == "torchrun" and trainer != "demo":
        raise ValueError(f"launcher torchrun runs the demo trainer, not {trainer!r}")
    run_dir = layout.run_dir(validate_run_name(run))
    torchrun = launcher == "torchrun"
    args = [
        sbatch,
        "--parsable",
        f"--job-name=rebound-demo-{run}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={1 if torchrun else tasks_per_node}",
        "--requeue",
        "--open-mode=append",
        *([] if torchrun else [f"--output={RunPaths(run_dir).logs}/job-%j-batch.log"]),
        f"--chdir={run_dir}",
        # The script's REBOUND_* variables travel in sbatch's own environment; ALL avoids comma-splitting paths.
        "--export=ALL",
    ]
    if gpus_per_node > 0:
        args.append(f"--gres=gpu:{gpus_per_node}")
    args += [*extra_sbatch_args, str(TORCHRUN_SBATCH_SCRIPT if torchrun else TRAINER_SCRIPTS[trainer])]
    args += ["--steps", str(steps), "--checkpoint-every", str(checkpoint_every), "--step-sleep", str(step_sleep)]
    return args


def submit_env(
    layout: LabLayout, run: str, env: Mapping[str, str] | None = None, *, python: str | None = None
) -> dict[str, str]:
    """sbatch's environment: ``env`` (default ours) plus the lab's SLURM_CONF and what train.sbatch needs."""
    out = dict(os.environ if env is None else env)
    # An inherited rendezvous override would pin every attempt of the job to one port, so a requeued attempt
    # could meet a lingering process of the previous one; the trainer derives a fresh port per attempt.
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        out.pop(var, None)
    out["SLURM_CONF"] = str(layout.slurm_conf)
    out["REBOUND_PYTHON"] = python or sys.executable
    out["REBOUND_RUN_DIR"] = str(layout.run_dir(run))
    existing = out.get("PYTHONPATH")
    out["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{existing}" if existing else str(REPO_ROOT)
    return out


def torchrun_log(layout: LabLayout, run: str) -> str:
    """The torchrun demo's one output file, as a pattern (``%j``: the job id): Slurm's default ``slurm-%j.out``."""
    return f"{layout.run_dir(validate_run_name(run))}/slurm-%j.out"


def parse_job_id(stdout: str) -> int:
    """``sbatch --parsable`` prints ``<job id>`` or ``<job id>;<cluster>``."""
    first = stdout.strip().splitlines()[-1].split(";", 1)[0].strip() if stdout.strip() else ""
    if not first.isdigit():
        raise SubmitError(f"sbatch printed no job id: {stdout.strip()!r}")
    return int(first)


def submit_demo(
    layout: LabLayout,
    run: str,
    *,
    nodes: int = 2,
    tasks_per_node: int = 2,
    gpus_per_node: int = 2,
    steps: int = DEFAULT_STEPS,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    step_sleep: float = DEFAULT_STEP_SLEEP,
    extra_sbatch_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    sbatch: str = "sbatch",
    timeout_s: float = 30.0,
    opt_in: bool = True,
    launcher: str = "srun",
    trainer: str = "demo",
    budget: int | None = None,
) -> int:
    """Create the run's directories and submit the demo job; returns the Slurm job id.

    Args:
        layout: the lab (``SLURM_CONF`` is set to its ``slurm.conf``).
        run: the run's name, a directory under ``layout.runs``; rerunning it resumes from its checkpoints.
        nodes: ``--nodes``.
        tasks_per_node: ``--ntasks-per-node``: ranks per node.
        gpus_per_node: ``--gres=gpu:N`` (0: none).
        steps: total training steps.
        checkpoint_every: rank 0 checkpoints every K steps.
        step_sleep: simulated device seconds per step.
        extra_sbatch_args: more sbatch options (``--exclude=n2``, ``--comment=...``), placed before the script.
        env: the environment for sbatch, inherited by the job (default: this process's).
        python: the ranks' interpreter (default: this one).
        sbatch: the sbatch executable.
        timeout_s: how long sbatch may take.
        opt_in: ask Rebound to keep the job running, through Slurm itself: ``--comment`` carries the spec
            (checkpoint directory, the ranks' log files), as any user would write it.
        launcher: ``srun`` (one task per rank, a log file per rank) or ``torchrun`` (torchrun under srun, one
            task per node, ``tasks_per_node`` workers each, everything in ``slurm-%j.out``).
        trainer: ``demo`` (``deploy.demo.train``), ``lightning`` or ``hf`` (``TRAINER_SCRIPTS``).
        budget: the comment's ``budget=`` (restarts Rebound may make); None: Rebound's default.

    Raises:
        ValueError: invalid run name, or unknown trainer.
        SubmitError: sbatch failed or printed no job id.
    """
    paths = RunPaths(layout.run_dir(validate_run_name(run)))
    paths.ensure()
    if opt_in:
        logs = torchrun_log(layout, run) if launcher == "torchrun" else f"{paths.logs}/job-%j-*.log"
        spec = f"rebound: ckpt={paths.checkpoints};logs={logs}" + (f";budget={budget}" if budget is not None else "")
        extra_sbatch_args = (f"--comment={spec}", *extra_sbatch_args)
    cmd = sbatch_command(
        layout,
        run,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        gpus_per_node=gpus_per_node,
        steps=steps,
        checkpoint_every=checkpoint_every,
        step_sleep=step_sleep,
        extra_sbatch_args=extra_sbatch_args,
        sbatch=sbatch,
        launcher=launcher,
        trainer=trainer,
    )
    environ = submit_env(layout, run, env, python=python)
    if launcher == "torchrun":
        environ["REBOUND_NPROC"] = str(tasks_per_node)
    try:
        done = subprocess.run(
            cmd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitError(f"cannot run {sbatch}: {exc}") from exc
    if done.returncode != 0:
        raise SubmitError(f"sbatch failed with status {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return parse_job_id(done.stdout)
