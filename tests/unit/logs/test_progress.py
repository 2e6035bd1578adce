"""Progress: step lines across trainer formats, checkpoint loads, and "the job resumed" across ranks and attempts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.logs import progress
from activities.logs.line import LogLine, split_prefix
from activities.logs.progress import (
    CHECKPOINT_RULES,
    STEP_RULES,
    find_progress,
    parse_checkpoint,
    parse_step,
)
from activities.logs.progress_rules import CHECKPOINT_WORDS
from activities.logs.tail import LogTail

DATA = Path(__file__).resolve().parents[2] / "data" / "logs"


def _line(text: str, *, path: str = "/logs/rank-0.log", rank: int | None = 0, offset: int = 0) -> LogLine:
    return LogLine(path=path, rank=rank, text=text, offset=offset, at=split_prefix(text).at)


STEPS: list[tuple[str, str, int, int | None, int | None]] = [
    # (line, rule, step, total, epoch)
    ("2026-11-30T03:40:01.123Z [INFO] rank=1/4 node=n1 step=120 loss=0.4123 step_time=0.105s", "step", 120, None, None),
    ("step 120 | loss 2.31", "step", 120, None, None),
    ("Step 120/1000: loss=0.52", "step", 120, 1000, None),
    ("step: 120, lr: 1e-4", "step", 120, None, None),
    ("[Rank 0] step=120, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]", "step", 120, None, None),  # DeepSpeed
    ("Epoch 3 | step 120 | loss 0.5", "step", 120, None, 3),
    ("epoch=2 global_step=4500 loss=1.2", "global_step", 4500, None, 2),
    ("global_step: 120", "global_step", 120, None, None),
    ("iteration 120/1000, loss=2.31", "iteration", 120, 1000, None),
    ("iter: 120 loss 3.2", "iteration", 120, None, None),
    (
        " [2024-05-01 10:00:00] iteration      120/    1000 | consumed samples:        15360 | elapsed time per"
        " iteration (ms): 1234.5 | learning rate: 1.500E-04 | global batch size:   128 | lm loss: 6.543210E+00 |",
        "megatron",
        120,
        1000,
        None,
    ),
    (
        "Epoch 0:  10%|█         | 120/1200 [00:10<01:30, 12.00it/s, v_num=0, train_loss=0.512]",
        "lightning_bar",
        120,
        1200,
        0,
    ),
    (" 10%|█         | 120/1200 [00:10<01:30, 12.00it/s]", "tqdm_bar", 120, 1200, None),
    ("0: 2026-11-30T03:40:01Z step=7 loss=1.0", "step", 7, None, None),  # srun --label
    # NeMo 2 (https://github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740): global_step, not the epoch's iteration
    (
        "Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 | "
        "global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106",
        "nemo",
        120,
        149,
        0,
    ),
    # NeMo 1's Lightning bar (https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55)
    (
        "Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, reduced_train_loss=3.090,"
        " global_step=794.0, consumed_samples=1.63e+6]",
        "lightning_bar",
        795,
        77225,
        0,
    ),
    # nanoGPT (https://github.com/karpathy/nanoGPT/issues/215)
    ("2023-03-22 09:30:39 iter 2920: loss 3.9883, time 1099.34ms, mfu 15.34%", "nanogpt", 2920, None, None),
    # DeepSpeed's pipeline engine (its MoE example's log, quoted in a public test script)
    (
        "steps: 200 loss: 5.5508 lm loss: 5.5103 moe loss: 0.0405 iter time (s): 0.936 samples/sec: 136.706",
        "deepspeed_steps",
        200,
        None,
        None,
    ),
    # DeepSpeed's throughput timer (https://github.com/deepspeedai/DeepSpeed/issues/3742)
    (
        "[2023-07-25 21:03:17,269] [INFO] [timer.py:215:stop] epoch=0/micro_step=34/global_step=34, "
        "RunningAvgSamplesPerSec=7.864669709950182, CurrSamplesPerSec=8.00912418308922, MemAllocated=59.65GB",
        "global_step",
        34,
        None,
        0,
    ),
]


@pytest.mark.parametrize(("text", "rule", "step", "total", "epoch"), STEPS)
def test_step_formats(text: str, rule: str, step: int, total: int | None, epoch: int | None) -> None:
    mark = parse_step(_line(text))
    assert mark is not None
    assert (mark.rule, mark.step, mark.total, mark.epoch) == (rule, step, total, epoch)
    assert mark.text == text.strip()


@pytest.mark.parametrize(
    "text",
    [
        # the demo's crash line names the step it died in
        "2026-11-30T04:04:27.343Z [ERROR] rank=1/2 node=n2 step=7 fatal error (fault crash-1): exiting with code 13",
        "2026-11-30T03:47:26.880Z [INFO] rank=0/4 node=n1 no checkpoint found, starting from step 0",
        "2026-11-30T03:47:28.006Z [INFO] rank=0/4 node=n1 saved checkpoint step_000010 (step 10, 20557 bytes, 0.013s)",
        "2026-11-30T03:47:37.584Z [INFO] rank=0/4 node=n1 resumed from checkpoint step_000010 (step 10)",
        "2026-11-30T03:47:26.292Z [INFO] rank=0/4 node=n1 starting: job_id=1 restart=0 steps=100000",
        " saving checkpoint at iteration     500 to /ckpt/gpt",
        "Resuming at step 500, skipping 500 batches",
        "step_time=0.105s",
        "{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}",
        "Traceback (most recent call last):",
    ],
)
def test_lines_that_mention_a_step_without_progress(text: str) -> None:
    assert parse_step(_line(text)) is None


CHECKPOINTS: list[tuple[str, str, str | None, int | None]] = [
    # (line, rule, loaded, step)
    (
        "2026-11-30T03:47:37.584Z [INFO] rank=0/4 node=n1 resumed from checkpoint step_000010 (step 10)",
        "resumed_from",
        "step_000010",
        10,
    ),  # noqa: E501
    (
        "2026-11-30T03:47:26.880Z [INFO] rank=0/4 node=n1 no checkpoint found, starting from step 0",
        "none_found",
        None,
        None,
    ),  # noqa: E501
    (" WARNING: could not find the metadata file /ckpt/latest_checkpointed_iteration.txt ", "none_found", None, None),
    ("    will not load any checkpoints and will start from random", "none_found", None, None),
    ("Training from scratch", "none_found", None, None),
    (" successfully loaded checkpoint from /ckpt/gpt [ t 1/1, p 1/1 ] at iteration 1000", "loaded", "/ckpt/gpt", 1000),
    ("Loaded checkpoint '/ckpt/model_epoch3.pt' (epoch 3)", "loaded", "/ckpt/model_epoch3.pt", None),
    ("Resuming from checkpoint /ckpt/run1/checkpoint-500", "resumed_from", "/ckpt/run1/checkpoint-500", 500),
    ("Resuming training from checkpoint: ckpt_42.", "resumed_from", "ckpt_42", None),
    (
        "Restoring states from the checkpoint path at /ckpt/epoch=2-step=3000.ckpt",
        "lightning_restore",
        "/ckpt/epoch=2-step=3000.ckpt",
        3000,
    ),
    # Lightning 1.x (https://github.com/nicolai256/Stable-textual-inversion_win/issues/12)
    (
        "Restored all states from the checkpoint file at /content/logs/checkpoints/last.ckpt",
        "lightning_restore",
        "/content/logs/checkpoints/last.ckpt",
        None,
    ),
    # Lightning's model summary header (https://github.com/john852517791/pytorch_lightning_FAD/issues/7) and
    # RichModelSummary's (https://github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740)
    (" | Name           | Type             | Params | Mode ", "lightning_summary", None, None),
    ("  | Name              | Type               | Params", "lightning_summary", None, None),
    ("┃   ┃ Name                   ┃ Type                   ┃ Params ┃ Mode  ┃", "lightning_summary", None, None),
    ("  Continuing training from checkpoint, will skip to saved global_step", "hf_continue", "", None),
    (" loading checkpoint from /ckpt/gpt at iteration 1000", "loading", "/ckpt/gpt", 1000),
    ("Loading the checkpoint at step 1000.", "loading", "", 1000),
    # Megatron-LM with torch_dist checkpoints
    (" loading distributed checkpoint from /ckpt/gpt at iteration 1000", "loading", "/ckpt/gpt", 1000),
    # DeepSpeed (https://github.com/EleutherAI/gpt-neox/pull/836)
    (
        "[2023-04-13 17:49:54,660] [INFO] [torch_checkpoint_engine.py:23:load] [Torch] Loading checkpoint from "
        "/mnt/329710/ckpt/global_step25000/zero_pp_rank_5_mp_rank_00_optim_states.pt...",
        "loading",
        "/mnt/329710/ckpt/global_step25000/zero_pp_rank_5_mp_rank_00_optim_states.pt",
        25000,
    ),
    # nanoGPT's fork GenerRNA (https://github.com/pfnet-research/GenerRNA/issues/7)
    ("Resuming training from psi_ft/", "nanogpt_resume", "psi_ft/", None),
    # HF Trainer: trainer.py logs "Loading model from {resume_from_checkpoint}." when it resumes
    (
        "[INFO|trainer.py:2195] 2024-03-01 10:12:05,998 >> Loading model from /out/checkpoint-180.",
        "hf_loading_model",
        "/out/checkpoint-180",
        180,
    ),
    # (https://github.com/hiyouga/LlamaFactory/issues/1813)
    (
        "[INFO|trainer.py:1791] 2023-12-12 10:12:06,000 >>   Continuing training from global step 200000",
        "hf_global_step",
        "",
        200000,
    ),
    # MMCV (https://github.com/open-mmlab/mmagic/issues/876)
    (
        "load checkpoint from local path: work_dirs/formal_basicvsr_plusplus_360new_cb/iter_90000.pth",
        "mmcv_load",
        "work_dirs/formal_basicvsr_plusplus_360new_cb/iter_90000.pth",
        90000,
    ),
    # HF Trainer's banner (https://github.com/deepspeedai/DeepSpeed/issues/3938 shows HF's "[INFO|...] >>" prefix)
    (
        "[INFO|trainer.py:1686] 2023-07-25 00:30:11,111 >> ***** Running training *****",
        "hf_running_training",
        None,
        None,
    ),
    # torchtitan (its checkpoint manager's completion line)
    (
        "[rank0]:[titan] 2025-06-16 22:29:41,101 - root - INFO - Finished loading the checkpoint in 61.68 seconds.",
        "finished_loading",
        "",
        None,
    ),
]


@pytest.mark.parametrize(("text", "rule", "loaded", "step"), CHECKPOINTS)
def test_checkpoint_formats(text: str, rule: str, loaded: str | None, step: int | None) -> None:
    mark = parse_checkpoint(_line(text))
    assert mark is not None
    assert (mark.rule, mark.loaded, mark.step, mark.found) == (rule, loaded, step, loaded is not None)
    assert parse_step(_line(text)) is None  # a checkpoint line is never progress
    assert any(word in text.lower() for word in CHECKPOINT_WORDS)  # the prefilter lets it through


def test_every_rule_is_tested() -> None:
    assert {rule for _, rule, *_ in STEPS} == {r.name for r in STEP_RULES}
    assert {rule for _, rule, *_ in CHECKPOINTS} == {r.name for r in CHECKPOINT_RULES}


@pytest.mark.parametrize(
    "text",
    [
        "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.50s/it]",  # pretrained weights, not a resume
        "2026-11-30T03:47:28.006Z [INFO] rank=0/4 node=n1 saved checkpoint step_000010 (step 10, 20557 bytes, 0.013s)",
        "checkpoint_every=10",
    ],
)
def test_not_checkpoint_loads(text: str) -> None:
    assert parse_checkpoint(_line(text)) is None


def test_lab_rank_file_across_a_requeue() -> None:
    lines, _ = LogTail([str(DATA / "lab-requeue-rank-0.log")]).read_new({})
    found = find_progress(lines)
    assert found is not None
    assert found.step == 12 and found.last is not None and found.last.rank == 0
    assert found.checkpoint is not None and found.checkpoint.loaded == "step_000010"
    assert found.resumed is not None and found.resumed_from is not None
    assert (found.resumed.step, found.resumed.at) == (11, datetime(2026, 11, 30, 3, 47, 37, 703000, UTC))
    assert (found.resumed_from.loaded, found.resumed_from.step) == ("step_000010", 10)


def _ts(second: int, millis: int = 0) -> str:
    return f"2026-11-30T03:47:{second:02d}.{millis:03d}Z [INFO]"


def test_resumed_is_the_latest_attempts_earliest_first_step_across_ranks() -> None:
    r0 = [
        f"{_ts(1)} rank=0/2 no checkpoint found, starting from step 0",
        f"{_ts(2)} rank=0/2 step=1 loss=1",
        f"{_ts(9, 500)} rank=0/2 resumed from checkpoint step_000010 (step 10)",
        f"{_ts(10, 300)} rank=0/2 step=11 loss=1",
        f"{_ts(10, 400)} rank=0/2 step=12 loss=1",
    ]
    r1 = [
        f"{_ts(1)} rank=1/2 no checkpoint found, starting from step 0",
        f"{_ts(2)} rank=1/2 step=1 loss=1",
        f"{_ts(9, 900)} rank=1/2 resumed from checkpoint step_000010 (step 10)",
        f"{_ts(10, 100)} rank=1/2 step=11 loss=1",
    ]
    lines = [_line(t, path="/l/rank-0.log", offset=i) for i, t in enumerate(r0)]
    lines += [_line(t, path="/l/rank-1.log", rank=1, offset=i) for i, t in enumerate(r1)]
    found = find_progress(lines)
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert (found.resumed.path, found.resumed.step) == ("/l/rank-1.log", 11)
    assert found.resumed_from.loaded == "step_000010"
    assert found.checkpoint is not None and found.checkpoint.path == "/l/rank-1.log"  # the latest load line
    assert found.step == 12


def test_not_resumed_until_a_step_follows_the_latest_load() -> None:
    lines = [
        _line(f"{_ts(1)} no checkpoint found, starting from step 0"),
        _line(f"{_ts(2)} step=1 loss=1"),
        _line(f"{_ts(9)} resumed from checkpoint step_000010 (step 10)"),
    ]
    found = find_progress(lines)
    assert found is not None and found.resumed is None
    assert found.checkpoint is not None and found.checkpoint.loaded == "step_000010"
    assert found.step == 1


def test_restart_from_scratch_counts_as_resumed_with_nothing_loaded() -> None:
    found = find_progress([_line("no checkpoint found, starting from step 0"), _line("step=1 loss=2")])
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert found.resumed.step == 1 and not found.resumed_from.found


def test_without_timestamps_the_last_pair_in_order_wins() -> None:
    lines = [
        _line("resumed from checkpoint a", path="/l/rank-0.log"),
        _line("step=5", path="/l/rank-0.log", offset=1),
        _line("resumed from checkpoint b", path="/l/rank-1.log"),
        _line("step=6", path="/l/rank-1.log", offset=1),
    ]
    found = find_progress(lines)
    assert found is not None and found.resumed_from is not None and found.resumed_from.loaded == "b"


def test_nothing_to_say() -> None:
    assert find_progress([]) is None
    assert find_progress([_line("Traceback (most recent call last):"), _line("hello")]) is None


def test_progress_bar_redraws_through_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(
        b"Restored all states from the checkpoint at /c/last.ckpt\n"
        + "".join(f"\rEpoch 1:  {i}%|█| {i}/100 [00:01<00:10, 9.00it/s]" for i in range(1, 6)).encode()
    )
    lines, _ = LogTail([str(tmp_path / "*.log")]).read_new({})
    found = find_progress(lines)
    assert found is not None and found.resumed is not None and found.last is not None
    assert found.resumed_from is not None and found.resumed_from.loaded == "/c/last.ckpt"
    assert (found.resumed.step, found.last.step, found.last.epoch) == (1, 4, 1)  # the 5th redraw is not complete yet


def test_public_api() -> None:
    assert sorted(progress.__all__) == list(progress.__all__)
    for name in progress.__all__:
        assert hasattr(progress, name), name
