"""The step line's cheap tests (``activities.logs.step_line``): each rule's ``needs`` is proved from its own regex,
and the readings with them equal the readings that run every regex."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs.progress_rules import (
    BAR_NOT_STARTED,
    EPOCH,
    NOT_PROGRESS,
    NOT_PROGRESS_WORDS,
    STEP_RULES,
    STEP_TIME_RULES,
    StepRule,
    StepTimeRule,
)
from activities.logs.step_line import StepFields, count, line_body, not_progress, parse_step_times, step_fields
from tests.unit.logs.regex_proof import proved


@pytest.mark.parametrize("rule", STEP_RULES, ids=lambda r: r.name)
def test_step_rule_needs_are_sound(rule: StepRule) -> None:
    assert rule.pattern.flags & re.IGNORECASE and rule.needs.isascii()
    assert proved(rule.pattern, (rule.needs,)), rule.name


@pytest.mark.parametrize("rule", STEP_TIME_RULES, ids=lambda r: r.name)
def test_step_time_rule_needs_are_sound(rule: StepTimeRule) -> None:
    assert not rule.pattern.flags & re.IGNORECASE  # tested as written, not lower-cased
    assert proved(rule.pattern, rule.needs), rule.name


def test_not_progress_words_and_epoch_are_sound() -> None:
    for pattern in NOT_PROGRESS:
        assert pattern.flags & re.IGNORECASE and proved(pattern, NOT_PROGRESS_WORDS), pattern.pattern
    assert EPOCH.flags & re.IGNORECASE and proved(EPOCH, ("epoch",))


def _reference(body: str) -> StepFields | None:
    """``step_fields`` the long way: every regex run, no text test first."""
    if any(p.search(body) for p in NOT_PROGRESS):
        return None
    for rule in STEP_RULES:
        m = rule.pattern.search(body)
        if m is None or count(m.group("step")) is None:
            continue
        step = int(m.group("step"))
        if rule.bar and (step == 0 or BAR_NOT_STARTED.search(body, m.end("step")) is not None):
            return None
        groups = m.groupdict()
        in_line = EPOCH.search(body)
        epoch = groups.get("epoch") or (in_line.group(1) if in_line else None)
        times: dict[str, float] = {}
        for t in STEP_TIME_RULES:
            hit = t.pattern.search(body)
            if hit is None or t.field in times or (t.step_rules and rule.name not in t.step_rules):
                continue
            seconds = parse_step_times(rule.name, hit.group(0))  # the rule's own reading of its own match
            value = seconds.step_time_s if t.field == "step_time_s" else seconds.compute_time_s
            if value is not None:
                times[t.field] = value
        total = count(groups.get("total"))
        return StepFields(rule, step, total, count(epoch), times.get("step_time_s"), times.get("compute_time_s"))
    return None


# Pieces of every rule's wording (both cases), of the prefixes, and characters that case folding pairs with ASCII
# letters (``ſ``, the Kelvin sign, dotted/dotless i): lines with them must take the long way and agree.
PIECES = [
    "Training epoch 0, iteration 3/10 | lr: 1e-05 | global_step: 5 | ",
    " iteration      120/    1000 | ",
    "Epoch 1:  10%|█   | 12/100 [00:01<00:09, 9.00it/s]",
    " 10%|#  | 120/1200 [00:10<01:30, 2.54s/it]",
    "iter 3: loss 2.31, time 12.5ms",
    "steps: 10 loss: 0.69 iter time (s): 0.123",
    "global_step=12",
    "Global Step 5",
    "iter=4",
    "ITERATION: 7",
    "step=120",
    "Step 5/10",
    "STEP: 7",
    "step_time=0.2s",
    "'time_per_step': 3",
    "compute_time=0.1s",
    "elapsed time per iteration (ms): 123.4",
    "train_step_timing in s: 0.03",
    "time 12ms",
    "Checkpoint",
    "time (ms) | fwd: 5.0 | step: 3",
    "ERROR",
    "Fatal",
    "Traceback",
    "Resuming at step 500",
    "restarting from iteration 3",
    "Continuing training from global step 180",
    "Will skip the first 3",
    "step 2000: train loss 1.6, val loss 1.8",
    "epoch 3",
    "EPOCH=2",
    "loss=0.5",
    "[rank3]: ",
    "2026-12-02T07:50:01.123Z ",
    "[INFO] rank=3/8 node=g00001 ",
    "0: ",
    "\x1b[31m",
    " ",
    "12",
    "ſtep 4",
    "\u212aeep",
    "ıter 9",
    "İTERATION 8",
    "sTEP=3",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=6))
def test_readings_equal_the_long_way(pieces: list[str]) -> None:
    body = line_body("".join(pieces))
    low = body.lower() if body.isascii() else None
    assert not_progress(body, low) == any(p.search(body) for p in NOT_PROGRESS)
    assert step_fields(body) == _reference(body)
