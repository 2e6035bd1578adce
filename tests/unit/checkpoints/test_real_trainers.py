"""Checkpoints written by the real Hugging Face Trainer and PyTorch Lightning (the ``trainers`` extra), once per
session, on CPU, with tiny models built from config (nothing downloaded): ``scan_checkpoints`` must call them valid
at the step the trainer reached, and incomplete after the breaks users hit. Where a quarantine is asked for, the
framework's own resume lookup must then pick the previous complete save.

Skipped only when the extra is not installed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from activities.checkpoints.quarantine import quarantine_partial_newest
from activities.checkpoints.scan import scan_checkpoints
from workflows.domain.checkpoints import CheckpointFormat, CheckpointReport, CheckpointStatus, QuarantineAction

MAX_STEPS = 4
SAVE_EVERY = 2


@dataclass(frozen=True)
class LightningRuns:
    copy: Path
    """``ModelCheckpoint(save_last=True)``: ``last.ckpt`` is a copy of the newest save."""
    link: Path
    """``ModelCheckpoint(save_last="link")``: ``last.ckpt`` is a symlink to the newest save."""


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``Trainer.train()`` of a 2-layer GPT-2 for 4 steps, saving every 2 (``checkpoint-2``, ``checkpoint-4``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf") / "run"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("TRANSFORMERS_OFFLINE", "1")
        env.setenv("WANDB_DISABLED", "true")
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
        )
        args = transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=MAX_STEPS,
            save_strategy="steps",
            save_steps=SAVE_EVERY,
            per_device_train_batch_size=4,
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            logging_steps=100,
            dataloader_num_workers=0,
        )
        tokens = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))
        data = [{"input_ids": row, "labels": row} for row in tokens]
        transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data).train()
    return out


@pytest.fixture(scope="session")
def lightning_runs(tmp_path_factory: pytest.TempPathFactory) -> LightningRuns:
    """``Trainer.fit`` for 4 steps with a checkpoint every 2 steps, once with ``save_last=True``, once ``"link"``."""
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Tiny(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, _index: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    root = tmp_path_factory.mktemp("lightning")
    modes: tuple[tuple[bool | Literal["link"], str], ...] = ((True, "copy"), ("link", "link"))
    for mode, name in modes:
        saver = ModelCheckpoint(dirpath=root / name, every_n_train_steps=SAVE_EVERY, save_top_k=-1, save_last=mode)
        trainer = lightning.Trainer(
            max_steps=MAX_STEPS,
            accelerator="cpu",
            devices=1,
            callbacks=[saver],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Tiny(), train_dataloaders=data)
    return LightningRuns(copy=root / "copy", link=root / "link")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _status(report: CheckpointReport) -> dict[str, tuple[CheckpointStatus, int | None]]:
    return {Path(c.path).name: (c.status, c.step) for c in report.checked}


def _latest(report: CheckpointReport) -> tuple[str, int]:
    assert report.latest_valid is not None, report
    return Path(report.latest_valid.path).name, report.latest_valid.step or -1


# --- Hugging Face Trainer -----------------------------------------------------------------------------------------


def test_hf_trainer_checkpoints_are_valid_at_the_trainers_step(hf_run: Path) -> None:
    report = scan_checkpoints(hf_run)
    assert report.format is CheckpointFormat.HF_TRAINER and report.error is None
    assert _latest(report) == ("checkpoint-4", 4)
    assert _status(report) == {
        "checkpoint-4": (CheckpointStatus.VALID, 4),
        "checkpoint-2": (CheckpointStatus.VALID, 2),
    }
    assert (hf_run / "checkpoint-4" / "model.safetensors").is_file()  # the weights format the tests break below


def test_hf_without_trainer_state_is_incomplete_and_quarantine_makes_hf_resume_the_previous(
    hf_run: Path, tmp_path: Path
) -> None:
    from transformers.trainer_utils import get_last_checkpoint as untyped_get_last_checkpoint

    def get_last_checkpoint(folder: str) -> str | None:
        found: str | None = untyped_get_last_checkpoint(folder)  # type: ignore[no-untyped-call]
        return found

    run = _copy(hf_run, tmp_path / "run")
    (run / "checkpoint-4" / "trainer_state.json").unlink()
    report = scan_checkpoints(run)
    assert _latest(report) == ("checkpoint-2", 2)
    assert [(Path(i.path).name, i.step) for i in report.incomplete] == [("checkpoint-4", 4)]
    assert "trainer_state.json" in report.incomplete[0].reason
    assert get_last_checkpoint(str(run)) == str(run / "checkpoint-4")  # HF itself would pick the partial one
    result = quarantine_partial_newest(run, os.getuid())
    assert result.action is QuarantineAction.QUARANTINED, result
    assert get_last_checkpoint(str(run)) == str(run / "checkpoint-2")


@pytest.mark.parametrize("size", ["truncated", "zero-byte"])
def test_hf_with_a_broken_weight_file_is_incomplete(hf_run: Path, tmp_path: Path, size: str) -> None:
    run = _copy(hf_run, tmp_path / "run")
    weights = run / "checkpoint-4" / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(0 if size == "zero-byte" else weights.stat().st_size // 2)
    report = scan_checkpoints(run)
    assert _latest(report) == ("checkpoint-2", 2)
    assert _status(report)["checkpoint-4"] == (CheckpointStatus.INCOMPLETE, 4)
    assert "model.safetensors" in report.incomplete[0].reason


# --- PyTorch Lightning --------------------------------------------------------------------------------------------


def test_lightning_checkpoints_and_last_copy_are_valid(lightning_runs: LightningRuns) -> None:
    report = scan_checkpoints(lightning_runs.copy)
    assert report.format is CheckpointFormat.LIGHTNING and report.error is None
    assert _latest(report)[1] == MAX_STEPS
    # last.ckpt's step is read from the file itself (global_step, through the inert unpickler): an OrderedDict
    # state_dict inside must not make it unreadable.
    assert _status(report) == {
        "last.ckpt": (CheckpointStatus.VALID, 4),
        "epoch=0-step=4.ckpt": (CheckpointStatus.VALID, 4),
        "epoch=0-step=2.ckpt": (CheckpointStatus.VALID, 2),
    }


def test_lightning_last_link_is_valid_and_a_dangling_one_is_incomplete(
    lightning_runs: LightningRuns, tmp_path: Path
) -> None:
    assert (lightning_runs.link / "last.ckpt").is_symlink()  # save_last="link" really wrote a symlink
    report = scan_checkpoints(lightning_runs.link)
    assert _latest(report) == ("last.ckpt", 4)  # the newest completion marker: the link, written after its target
    assert _status(report)["last.ckpt"] == (CheckpointStatus.VALID, 4)

    run = _copy(lightning_runs.link, tmp_path / "run")
    (run / "epoch=0-step=4.ckpt").unlink()  # the newest save gone: last.ckpt dangles
    report = scan_checkpoints(run)
    assert _latest(report) == ("epoch=0-step=2.ckpt", 2)
    assert _status(report)["last.ckpt"][0] is CheckpointStatus.INCOMPLETE
    result = quarantine_partial_newest(run, os.getuid())
    assert result.action is QuarantineAction.QUARANTINED, result
    # ckpt_path="last" now resumes from the previous complete save, not from scratch.
    assert (run / "last.ckpt").resolve() == (run / "epoch=0-step=2.ckpt").resolve()


def test_lightning_truncated_checkpoint_is_incomplete(lightning_runs: LightningRuns, tmp_path: Path) -> None:
    run = _copy(lightning_runs.copy, tmp_path / "run")
    for name in ("epoch=0-step=4.ckpt", "last.ckpt"):  # a save killed mid-write
        path = run / name
        with path.open("r+b") as f:
            f.truncate(path.stat().st_size // 2)
    report = scan_checkpoints(run)
    assert _latest(report) == ("epoch=0-step=2.ckpt", 2)
    statuses = _status(report)
    assert statuses["epoch=0-step=4.ckpt"] == (CheckpointStatus.INCOMPLETE, 4)
    assert statuses["last.ckpt"][0] is CheckpointStatus.INCOMPLETE
