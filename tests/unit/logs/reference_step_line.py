# The step-line reader before issue 12's fourth pass, kept verbatim: the oracle of test_step_line_starts.
"""The reading of one step line, as plain values: what ``activities.logs.progress`` builds its ``StepMark`` from and
what the watch folds into its progress state on every poll (``activities.logs.job_watcher``), so it is the hot path
of a watch hub with thousands of jobs (docs/benchmarks/scale.md, "Hub CPU per poll").

The rules and their order are ``activities.logs.progress``'s (``STEP_RULES``, ``NOT_PROGRESS``, ``STEP_TIME_RULES``:
first match wins). What makes it cheap without changing any answer: a rule whose regex needs a text the line lacks
cannot match, so its regex is not run. For the case-insensitive rules that test is made on the lower-cased line,
and only for an ASCII line (Unicode case folding lets a few other characters match ASCII letters: ``ſ``, the Kelvin
sign); a line with other characters runs every regex. Each rule's ``needs`` is proved from its own regex
(``tests/unit/logs/test_step_line.py``).
"""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

from activities.logs.line import split_prefix
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
from activities.logs.terminal import strip_terminal_codes

__all__ = [
    "MAX_DIGITS",
    "MAX_STEP_TIME_S",
    "StepFields",
    "StepTimes",
    "count",
    "line_body",
    "not_progress",
    "parse_step_times",
    "step_fields",
    "step_match",
]

#: A step time above this (30 days) is a parse accident, not a measurement.
MAX_STEP_TIME_S = 30 * 24 * 3600.0
#: More digits than an int64 holds: no counter has them.
MAX_DIGITS = 18


class StepTimes(NamedTuple):
    step_time_s: float | None
    compute_time_s: float | None


class StepFields(NamedTuple):
    """A step line's reading (``activities.logs.progress.StepMark`` without the line's own facts)."""

    rule: StepRule
    step: int
    total: int | None
    epoch: int | None
    step_time_s: float | None
    compute_time_s: float | None


def line_body(text: str) -> str:
    """The line without its prefixes and terminal escape codes: what every rule reads."""
    return split_prefix(strip_terminal_codes(text), parse_time=False).body


def step_fields(body: str) -> StepFields | None:
    """The training step a line's ``body`` (``line_body``) reports, by the first matching rule of ``STEP_RULES``;
    None for lines that report no step, match ``NOT_PROGRESS``, or are a progress bar's frame that counted nothing
    yet (``activities.logs.progress``)."""
    low = body.lower() if body.isascii() else None
    if not_progress(body, low):
        return None
    found = step_match(body, low)
    if found is None:
        return None
    rule, m = found
    step = int(m.group("step"))
    if rule.bar and (step == 0 or BAR_NOT_STARTED.search(body, m.end("step")) is not None):
        return None  # the bar's first frame, or its starting point after a resume (``parse_checkpoint``)
    epoch = m.group("epoch") if "epoch" in rule.pattern.groupindex else None
    if epoch is None and (low is None or "epoch" in low):
        in_line = EPOCH.search(body)
        epoch = in_line.group(1) if in_line else None
    total = m.group("total") if "total" in rule.pattern.groupindex else None
    times = parse_step_times(rule.name, body)
    return StepFields(rule, step, count(total), count(epoch), times.step_time_s, times.compute_time_s)


def not_progress(body: str, low: str | None) -> bool:
    """Whether a ``NOT_PROGRESS`` pattern is in ``body``; ``low`` is ``body.lower()`` for an ASCII body, else None
    (an ASCII line with none of ``NOT_PROGRESS_WORDS`` cannot match: the regex is skipped)."""
    if low is not None and not any(word in low for word in NOT_PROGRESS_WORDS):
        return False
    return _NOT_PROGRESS_ANY.search(body) is not None


def step_match(body: str, low: str | None) -> tuple[StepRule, re.Match[str]] | None:
    """The first ``STEP_RULES`` rule that matches ``body`` with a usable step, and its match; ``low`` as in
    ``not_progress`` (an ASCII line skips every rule whose ``needs`` it lacks)."""
    for rule in STEP_RULES:
        if low is not None and rule.needs not in low:
            continue
        m = rule.pattern.search(body)
        if m is not None and count(m.group("step")) is not None:
            return rule, m
    return None


def parse_step_times(step_rule: str, body: str) -> StepTimes:
    """The step and compute times a step line's ``body`` gives, by ``STEP_TIME_RULES``, as ``StepMark`` fields.

    Args:
        step_rule: The name of the ``STEP_RULES`` rule that matched the line.
        body: The line without its prefixes.

    Returns:
        Each time when the line gives a finite, non-negative value no larger than ``MAX_STEP_TIME_S``, else None
        (``?it/s`` and ``0it/s`` give none).
    """
    found: dict[str, float] = {}
    for rule in _time_rules_for(step_rule):
        if rule.field in found:
            continue
        if rule.needs:
            for text in rule.needs:
                if text in body:
                    break
            else:
                continue  # it cannot match (``StepTimeRule.needs``)
        m = rule.pattern.search(body)
        if m is None:
            continue
        seconds = _seconds(float(m.group("value")), m.groupdict().get("unit") or rule.unit)
        if seconds is not None:
            found[rule.field] = seconds
    return StepTimes(found.get("step_time_s"), found.get("compute_time_s"))


@functools.lru_cache(maxsize=64)
def _time_rules_for(step_rule: str) -> tuple[StepTimeRule, ...]:
    """The ``STEP_TIME_RULES`` that read the lines of the step rule named ``step_rule``, in order (the step rules are
    a handful: each poll's lines no longer test every time rule's ``step_rules``)."""
    return tuple(rule for rule in STEP_TIME_RULES if not rule.step_rules or step_rule in rule.step_rules)


def count(digits: str | None) -> int | None:
    """A step, total or epoch number; None for none, or for more digits than an int64 holds (no counter has
    them, and ``int()`` of a long digit string is slow, then a ValueError past 4300 digits)."""
    return int(digits) if digits and len(digits) <= MAX_DIGITS else None


def _seconds(value: float, unit: str) -> float | None:
    if unit == "it/s":
        value = 1.0 / value if value > 0 else math.inf
    elif unit == "ms":
        value /= 1000.0
    return value if math.isfinite(value) and 0 <= value <= MAX_STEP_TIME_S else None


def _any_of(patterns: tuple[re.Pattern[str], ...]) -> re.Pattern[str]:
    """One regex that matches where any of ``patterns`` does (one pass over a line instead of one each)."""
    flags = {p.flags for p in patterns}
    if len(flags) != 1:
        raise ValueError("patterns joined into one must share their flags")
    return re.compile("|".join(f"(?:{p.pattern})" for p in patterns), flags.pop())


_NOT_PROGRESS_ANY = _any_of(NOT_PROGRESS)
