"""Step and compute times on step lines, across trainer formats (the real text each format prints)."""

from __future__ import annotations

import pytest

from activities.logs.line import LogLine, split_prefix
from activities.logs.progress import STEP_TIME_RULES, StepTimes, parse_step, parse_step_times


def _line(text: str) -> LogLine:
    return LogLine(path="/logs/rank-0.log", rank=0, text=text, offset=0, at=split_prefix(text).at)


TIMES: list[tuple[str, str, int, float | None, float | None]] = [
    # (line, time rules ("+"-joined), step, step_time_s, compute_time_s)
    (
        "2026-11-30T03:40:01.123Z [INFO] rank=1/4 node=n1 step=120 loss=0.4123 step_time=0.215s compute_time=0.180s",
        "step_time+compute_time",
        120,
        0.215,
        0.180,
    ),
    ("step 7 | step_time: 215ms | compute_time: 180ms", "step_time+compute_time", 7, 0.215, 0.180),
    ("step: 9, loss: 0.5, 'step_time': 0.25", "step_time", 9, 0.25, None),
    ("global_step=300 time_per_step=1.5e-1", "step_time", 300, 0.15, None),
    (
        " [2024-05-01 10:00:00] iteration      120/    1000 | consumed samples:        15360 | elapsed time per"
        " iteration (ms): 1234.5 | learning rate: 1.500E-04 | global batch size:   128 | lm loss: 6.543210E+00 |",
        "megatron",
        120,
        1.2345,
        None,
    ),
    # Newer Megatron-LM prints the current value and the recent mean: the first is this interval's.
    (
        " [2025-02-01 10:00:00] iteration      199/  317892 | consumed samples:       152832 | elapsed time per"
        " iteration (ms): 14287.5/14301.2 | learning rate: 2.407E-04 |",
        "megatron",
        199,
        14.2875,
        None,
    ),
    ("iter 100: loss 2.3100, time 123.45ms, mfu 30.12%", "iter_time", 100, 0.12345, None),
    ("iter 5: loss 4.0000, time 2.5s", "iter_time", 5, 2.5, None),
    (
        "Epoch 0:   1%|          | 7/743 [00:18<31:07,  2.54s/it, loss=12.0042, global_step=7, toks/s=4013.1]",
        "bar_rate",
        7,
        2.54,
        None,
    ),
    (" 10%|█         | 120/1200 [00:10<01:30, 12.50it/s]", "bar_rate", 120, 0.08, None),
    # NeMo 2 (https://github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740)
    (
        "Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 | "
        "global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106",
        "nemo",
        120,
        0.03146,
        None,
    ),
    # DeepSpeed's pipeline engine prints "steps: {global_steps} loss: ... iter time (s): ... samples/sec: ...".
    ("steps: 10 loss: 0.6931 iter time (s): 0.123 samples/sec: 260.163", "deepspeed_iter_time", 10, 0.123, None),
]


@pytest.mark.parametrize(("text", "rule", "step", "step_time", "compute_time"), TIMES)
def test_times_per_format(text: str, rule: str, step: int, step_time: float | None, compute_time: float | None) -> None:
    mark = parse_step(_line(text))
    assert mark is not None and mark.step == step
    assert mark.step_time_s == pytest.approx(step_time) if step_time is not None else mark.step_time_s is None
    assert (
        mark.compute_time_s == pytest.approx(compute_time) if compute_time is not None else mark.compute_time_s is None
    )


def test_every_time_rule_is_tested() -> None:
    assert {name for _, rules, *_ in TIMES for name in rules.split("+")} == {r.name for r in STEP_TIME_RULES}


@pytest.mark.parametrize(
    "text",
    [
        "step=120 loss=0.41",  # no time at all
        " 1%|          | 1/1200 [00:00<00:00, 0.00it/s]",  # a zero rate is no duration
        "step=3 step_time=0.215sec",  # unknown unit: nothing rather than a wrong number
        "step=3 step_time=1e99s",  # beyond any real step
        "step 120 | total time 3600s",  # a total, not a per-step time: only nanoGPT's "iter N: ... time" counts
        "step=4 data_time=0.01s",
        " 10%|█         | 120/1200 [00:10<01:30, 1.20kit/s]",  # a scaled rate (unit_scale): not read
    ],
)
def test_no_time(text: str) -> None:
    mark = parse_step(_line(text))
    assert mark is not None
    assert (mark.step_time_s, mark.compute_time_s) == (None, None)


def test_a_bar_before_its_first_rate_is_no_step() -> None:
    assert parse_step(_line(" 0%|          | 0/1200 [00:00<?, ?it/s]")) is None


def test_deepspeed_timer_lines_are_neither_steps_nor_times() -> None:
    # DeepSpeed's wall-clock breakdown ends in "step: <ms>": before this rule it read as step 582.
    timer = (
        "[2024-04-04 09:09:53,313] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 5722.49 | bwd: 16107.19"
        " | bwd_inner: 15029.70 | bwd_allreduce: 1077.03 | step: 582.04"
    )
    assert parse_step(_line(timer)) is None
    # Its own step line has no duration, and samples/sec needs the batch size: no time.
    mark = parse_step(
        _line(
            "[2023-08-02 00:41:17,935] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=10, lr=[0.0001], "
            "mom=[(0.9, 0.999)]"
        )
    )
    assert mark is not None and mark.step == 10 and mark.step_time_s is None


def test_rules_apply_only_to_their_step_formats() -> None:
    # "time 2s" on a plain step line is not nanoGPT's per-iteration time.
    assert parse_step_times("step", "step 3 time 2s") == StepTimes(None, None)
    assert parse_step_times("iteration", "iter 3: loss 1.0, time 2s") == StepTimes(2.0, None)
    assert parse_step_times("step", "step 3 [00:01<00:02, 2.00s/it]") == StepTimes(None, None)


def test_first_rule_wins_per_field() -> None:
    body = "iter 3: step_time=0.5s time 900ms compute_time=0.4s"
    assert parse_step_times("iteration", body) == StepTimes(0.5, 0.4)


def test_times_survive_the_mark_round_trip() -> None:
    mark = parse_step(_line("step=1 step_time=0.105s compute_time=0.081s"))
    assert mark is not None
    again = type(mark).model_validate(mark.model_dump(mode="json"))
    assert again == mark and again.step_time_s == 0.105
