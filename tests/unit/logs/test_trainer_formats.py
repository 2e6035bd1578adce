"""Progress as real trainers print it: bars redrawn with ``\\r``, resumes, colour codes, each trainer's counting.

Wordings come from public logs (the URL beside each) or, where no public log quotes a line, from the trainer's own
logging call (named). The bar frames follow tqdm's format (``n/total [elapsed<remaining, rate]``).
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

from activities.logs.line import LogLine, split_prefix
from activities.logs.progress import find_progress, parse_checkpoint, parse_step, parse_training
from activities.logs.tail import LogTail


def _lines(*texts: str, path: str = "/logs/slurm-5.out") -> list[LogLine]:
    return [LogLine(path=path, rank=0, text=text, offset=i, at=split_prefix(text).at) for i, text in enumerate(texts)]


def _read_all(tmp_path: Path, data: bytes) -> list[LogLine]:
    log = tmp_path / "slurm-5.out"
    log.write_bytes(data)
    lines, _ = LogTail([str(log)]).read_new({})
    return lines


# ----- bars ------------------------------------------------------------------------------------------------------


def test_a_bars_first_frame_is_not_a_trained_step() -> None:
    # The case: a job resumed at step 180 printed this first; it was read as "training again at step 0".
    for frame in (
        "  0%|          | 0/100000 [00:00<?, ?it/s]",
        "Epoch 3:   0%|          | 0/1000 [00:00<?, ?it/s]",  # every Lightning epoch starts its bar again
        "Epoch 3:   0%|          | 0/1000 [00:00<?, ?it/s, v_num=0]",
    ):
        line = _lines(frame)[0]
        assert parse_step(line) is None, frame
        assert parse_checkpoint(line) is None, frame  # at 0 it says nothing about where training resumed


def test_a_bar_that_starts_past_zero_is_the_resume_point_not_a_step() -> None:
    # A loop that resumes its bar where it left off (tqdm(initial=180)) draws 180/100000 before training anything.
    start = _lines("  0%|          | 180/100000 [00:00<?, ?it/s]")[0]
    assert parse_step(start) is None
    mark = parse_checkpoint(start)
    assert mark is not None and (mark.rule, mark.loaded, mark.step) == ("bar_start", "", 180)
    trained = parse_step(_lines("  0%|          | 181/100000 [00:01<27:43:00,  1.00it/s]")[0])
    assert trained is not None and trained.steps_done == 181


def test_hf_trainer_resume_through_the_tail(tmp_path: Path) -> None:
    # HF Trainer's log on a resume (wordings from trainer.py; https://github.com/hiyouga/LlamaFactory/issues/1813
    # shows the same sequence), its bar redrawn with \r, and its loss dicts written between redraws.
    data = (
        b"[INFO|trainer.py:2195] 2024-03-01 10:12:05,998 >> Loading model from /out/checkpoint-180.\n"
        b"[INFO|trainer.py:1721] 2024-03-01 10:12:06,000 >> ***** Running training *****\n"
        b"[INFO|trainer.py:1789] 2024-03-01 10:12:06,000 >>   Continuing training from checkpoint, will skip to saved"
        b" global_step\n"
        b"[INFO|trainer.py:1790] 2024-03-01 10:12:06,000 >>   Continuing training from epoch 0\n"
        b"[INFO|trainer.py:1791] 2024-03-01 10:12:06,000 >>   Continuing training from global step 180\n"
        b"[INFO|trainer.py:1793] 2024-03-01 10:12:06,000 >>   Will skip the first 0 epochs then the first 1440 "
        b"batches in the first epoch.\n"
        + b"\r  0%|          | 0/100000 [00:00<?, ?it/s]"
        + b"\r  0%|          | 181/100000 [00:04<10:00:00,  2.77it/s]"
        + b"\r{'loss': 0.4523, 'grad_norm': 1.093, 'learning_rate': 4.99e-05, 'epoch': 0.03}\n"
        + b"\r  0%|          | 182/100000 [00:05<10:00:00,  2.77it/s]"
        + b"\r  0%|          | 183/100000 [00:05<10:00:00,  2.77it/s]"  # not complete yet: no \r after it
    )
    found = find_progress(_read_all(tmp_path, data))
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert found.resumed.steps_done == 181  # the bar's jump from 0 to the first step trained
    assert (found.resumed_from.loaded, found.resumed_from.step) == ("/out/checkpoint-180", 180)
    assert found.resumed.steps_done == 180 + 1  # resumed from exactly that checkpoint
    assert found.last is not None and found.last.step == 182  # the latest complete frame
    assert found.trained is not None and found.trained.epoch == 0.03 and found.trained_since_checkpoint


def test_hf_trainer_fresh_start_is_a_start_from_scratch() -> None:
    found = find_progress(
        _lines(
            "[INFO|trainer.py:1686] 2024-03-01 10:12:06,000 >> ***** Running training *****",
            "[INFO|trainer.py:1687] 2024-03-01 10:12:06,000 >>   Num examples = 1,000",
            "  0%|          | 0/100000 [00:00<?, ?it/s]",
            "  0%|          | 1/100000 [00:01<27:46:39,  1.00s/it]",
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert not found.resumed_from.found and found.resumed.steps_done == 1


def test_hf_loss_dicts_prove_training_without_naming_a_step() -> None:
    # https://github.com/huggingface/sentence-transformers/issues/3756 (newer versions quote the numbers)
    for text in (
        "{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}",
        "{'loss': '0.91', 'grad_norm': '0.8618', 'learning_rate': '3.094e-07', 'epoch': '0.6623'}",
    ):
        line = _lines(text)[0]
        assert parse_step(line) is None
        mark = parse_training(line)
        assert mark is not None and mark.epoch is not None
    for not_training in (
        "{'eval_loss': 0.61, 'eval_runtime': 12.3, 'eval_samples_per_second': 81.2, 'epoch': 1.0}",
        "{'train_runtime': 1234.5, 'train_samples_per_second': 12.1, 'train_loss': 0.55, 'epoch': 3.0}",
    ):
        assert parse_training(_lines(not_training)[0]) is None
    found = find_progress(_lines("Loading model from /out/checkpoint-40.", "{'loss': 0.5, 'epoch': 0.1}"))
    assert found is not None and found.step is None and found.trained_since_checkpoint
    assert found.checkpoint is not None and found.checkpoint.step == 40


def test_every_frame_of_a_long_bar_is_read_in_bounded_memory(tmp_path: Path) -> None:
    # 10 MB of \r-separated frames and no newline: each frame is its own line with its own byte offset, read a
    # bounded number at a time; the last complete frame is the current progress.
    frame = "\rEpoch 0:  {pct:3d}%|#         | {n}/150000 [01:02<10:00,  9.00it/s, v_num=0, train_loss=0.512]"
    frames = [frame.format(pct=n * 100 // 150000, n=n) for n in range(1, 150001)]
    data = "".join(frames).encode()
    assert len(data) > 10_000_000
    log = tmp_path / "slurm-5.out"
    log.write_bytes(data)
    tail = LogTail([str(log)])
    tracemalloc.start()
    batch, offsets = tail.read_new({})  # a full call: as many frames as one call may take
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 32 << 20, peak
    started = time.perf_counter()
    seen, end, last_batch = 0, 0, batch
    while batch:
        for line in batch:  # every frame in order, each at its own first byte: (path, offset) stays its identity
            assert line.offset == end + 1 and line.text == frames[seen][1:]
            seen, end = seen + 1, line.offset + len(line.text)
        last_batch = batch
        batch, offsets = tail.read_new(offsets)
    assert seen == len(frames) - 1  # the newest frame waits for the \r that starts the next redraw
    found = find_progress(last_batch)
    assert found is not None and found.last is not None
    assert (found.last.step, found.last.epoch, found.last.step_time_s) == (149_999, 0, 1 / 9)
    assert time.perf_counter() - started < 60


def test_crlf_bars_and_lines_still_end_where_they_should(tmp_path: Path) -> None:
    lines = _read_all(tmp_path, b"step=1 loss=2\r\n\r 10%|#  | 10/100 [00:01<00:09, 9.0it/s]\r\nstep=2 loss=1\r\n")
    assert [(line.text, line.offset) for line in lines] == [
        ("step=1 loss=2", 0),
        (" 10%|#  | 10/100 [00:01<00:09, 9.0it/s]", 16),
        ("step=2 loss=1", os.path.getsize(tmp_path / "slurm-5.out") - 15),
    ]


# ----- each trainer's resume ---------------------------------------------------------------------------------------


def test_torchtitan_coloured_step_lines_and_checkpoint_load() -> None:
    # torchtitan colours each field of its step line; the plain text is from
    # https://github.com/pytorch/torchtitan/pull/1287, the load lines from its checkpoint manager.
    red, green, yellow, blue, cyan, magenta, reset = (f"\x1b[{c}m" for c in (31, 32, 33, 34, 36, 35, 39))
    step = (
        f"[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - {red}step: 251  {green}loss:  6.1384  "
        f"{yellow}memory: 49.66GiB(52.28%)  {blue}tps: 5,856  {cyan}tflops: 339.16  {magenta}mfu: 34.29%{reset}"
    )
    mark = parse_step(_lines(step)[0])
    assert mark is not None and (mark.rule, mark.step, mark.steps_done) == ("step", 251, 251)
    found = find_progress(
        _lines(
            "[rank0]:[titan] 2025-06-16 22:29:40,001 - root - INFO - Loading the checkpoint at step 250.",
            "[rank0]:[titan] 2025-06-16 22:29:41,101 - root - INFO - Finished loading the checkpoint in 61.68 seconds.",
            step,
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert found.resumed_from.step == 250 and found.resumed.steps_done == found.resumed_from.step + 1
    assert found.checkpoint is not None and found.checkpoint.rule == "loading"  # the completion line filled it in
    newer = parse_checkpoint(_lines("Loading the checkpoint from ./outputs/checkpoint/step-250.")[0])
    assert newer is not None and (newer.loaded, newer.step) == ("./outputs/checkpoint/step-250", 250)


def test_nanogpt_counts_from_zero_and_evaluates_before_training() -> None:
    found = find_progress(
        _lines(
            "Resuming training from out",
            "step 3000: train loss 4.0390, val loss 4.0427",  # https://github.com/karpathy/nanoGPT/issues/215
            "iter 3000: loss 4.2490, time 35392.33ms, mfu 13.85%",
            "iter 3010: loss 3.9408, time 1097.30ms, mfu 15.34%",
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert found.resumed_from.loaded == "out"
    assert (found.resumed.step, found.resumed.steps_done, found.resumed.step_time_s) == (3000, 3001, 35.39233)


def test_nemo_global_step_counts_from_zero() -> None:
    # https://github.com/NVIDIA-NeMo/Speech/pull/10128: the first step trained logs global_step 0.
    mark = parse_step(
        _lines(
            "Training epoch 0, iteration 0/9 | lr: 0.0006 | consumed_samples: 32 | global_batch_size: 32 | "
            "global_step: 0 | reduced_train_loss: 11.02"
        )[0]
    )
    assert mark is not None and (mark.rule, mark.step, mark.steps_done, mark.epoch) == ("nemo", 0, 1, 0)
    mark = parse_step(
        _lines(
            "Training epoch 0, iteration 1/9 | lr: 0.0006 | consumed_samples: 64 | global_batch_size: 32 | "
            "global_step: 1 | reduced_train_loss: 9.761"
        )[0]
    )
    assert mark is not None and (mark.step, mark.steps_done) == (1, 2)


def test_megatron_resume() -> None:
    found = find_progress(
        _lines(
            " loading distributed checkpoint from /ckpt/gpt at iteration 1000",
            "  successfully loaded checkpoint from /ckpt/gpt [ t 1/1, p 1/1 ] at iteration 1000",
            " iteration     1001/  250000 | consumed samples:      1025024 | elapsed time per iteration (ms): 126995.3"
            " | learning rate: 1.365E-05 | global batch size:  1024 | lm loss: 2.382640E+00 |",
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert (found.resumed.steps_done, found.resumed_from.step) == (1001, 1000)


def test_lightning_resume_and_end() -> None:
    found = find_progress(
        _lines(
            "Restoring states from the checkpoint path at /ckpt/epoch=2-step=3000.ckpt",
            "Restored all states from the checkpoint at /ckpt/epoch=2-step=3000.ckpt",
            "Epoch 3:   0%|          | 0/1000 [00:00<?, ?it/s]",
            "Epoch 3:   0%|          | 1/1000 [00:00<09:59,  1.67it/s, v_num=1, train_loss=0.31]",
            "`Trainer.fit` stopped: `max_steps=4000` reached.",
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert (found.resumed.epoch, found.resumed.step, found.resumed.per_epoch) == (3, 1, True)  # batches of epoch 3
    assert (found.resumed_from.loaded, found.resumed_from.step) == ("/ckpt/epoch=2-step=3000.ckpt", 3000)
    assert found.last is not None and found.last.step == 1  # "max_steps=4000" is no step


def test_deepspeed_resume() -> None:
    found = find_progress(
        _lines(
            "[2023-04-13 17:49:54,660] [INFO] [torch_checkpoint_engine.py:23:load] [Torch] Loading checkpoint from "
            "/ckpt/global_step25000/mp_rank_00_model_states.pt...",
            "[2023-04-13 17:50:00,378] [INFO] [torch_checkpoint_engine.py:25:load] [Torch] Loaded checkpoint from "
            "/ckpt/global_step25000/mp_rank_00_model_states.pt.",
            "[2023-04-13 17:51:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=25010, skipped=0, lr=[3e-05], "
            "mom=[(0.9, 0.95)]",
        )
    )
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert (found.resumed.step, found.resumed_from.step) == (25010, 25000)


# Lightning's summary table as its ModelSummary callback prints it (wordings from
# https://github.com/john852517791/pytorch_lightning_FAD/issues/7 and nicolai256/Stable-textual-inversion_win#12).
_LIGHTNING_SUMMARY = (
    "  | Name           | Type             | Params | Mode ",
    "------------------------------------------------------------",
    "0 | model          | Model            | 341 M  | train",
    "1 | loss_criterion | CrossEntropyLoss | 0      | train",
    "------------------------------------------------------------",
    "25.9 M    Trainable params",
    "315 M     Non-trainable params",
    "341 M     Total params",
    "1,365.436 Total estimated model params size (MB)",
)
_LIGHTNING_STEPS = (
    "Epoch 0:   0%|          | 0/1000 [00:00<?, ?it/s]",
    "Epoch 0:   0%|          | 1/1000 [00:00<09:59,  1.67it/s, v_num=0, train_loss=2.31]",
)


def test_lightning_fresh_start_is_a_start_from_scratch() -> None:
    # No ckpt_path: no restore line, only the summary before the first step.
    found = find_progress(_lines(*_LIGHTNING_SUMMARY, *_LIGHTNING_STEPS))
    assert found is not None and found.resumed is not None and found.resumed_from is not None
    assert not found.resumed_from.found and found.resumed_from.rule == "lightning_summary"
    assert (found.resumed.epoch, found.resumed.step) == (0, 1)
    # Without a TTY Lightning draws no bar: the summary alone still says this attempt loaded nothing.
    quiet = find_progress(_lines(*_LIGHTNING_SUMMARY))
    assert quiet is not None and quiet.checkpoint is not None and not quiet.checkpoint.found
    assert quiet.resumed is None


def test_lightning_restore_before_or_after_the_summary_is_a_resume() -> None:
    restoring = "Restoring states from the checkpoint path at /ckpt/epoch=2-step=3000.ckpt"
    restored = "Restored all states from the checkpoint at /ckpt/epoch=2-step=3000.ckpt"
    # DDP (the default): restore, summary, restored; DeepSpeed/FSDP restore once set up: summary first.
    for order in (
        (restoring, *_LIGHTNING_SUMMARY, restored),
        (*_LIGHTNING_SUMMARY, restoring, restored),
        (*_LIGHTNING_SUMMARY, restored),  # Lightning 1.x showed only its "Restored all states" line
    ):
        found = find_progress(_lines(*order, *_LIGHTNING_STEPS))
        assert found is not None and found.resumed_from is not None, order
        assert found.resumed_from.found and found.resumed_from.loaded == "/ckpt/epoch=2-step=3000.ckpt", order
        assert found.checkpoint is not None and found.checkpoint.found, order
