"""Training progress in log lines: step counters and checkpoint loads, to tell that a job resumed.

Two tables, each tried in order with the first match winning: ``STEP_RULES`` (a regex with a ``step`` group and
optional ``total``/``epoch`` groups) and ``CHECKPOINT_RULES`` (``name`` and ``step`` groups, and whether the line
means a checkpoint was found). ``NOT_PROGRESS`` lists what makes a line with a step number not a progress line:
a checkpoint save names the step it saved, a crash report the step it died in, a plan the step it will start at.

A checkpoint line is never also a step line. Regexes run on the line's body (after its srun label, ``[rankN]:``
prefix and timestamp).

Step lines may also say how long the step took (``STEP_TIME_RULES``, first match per field): ``step_time`` is the
whole step (compute, collectives, optimizer; in synchronous data parallelism the same on every rank) and
``compute_time`` a rank's own work before the gradient collective (where a straggler shows). Formats: ours
(``step_time=0.215s compute_time=0.180s``), Megatron-LM's ``elapsed time per iteration (ms): 1234.5`` (an average
over its log interval), nanoGPT's ``iter 120: loss 2.31, time 123.45ms`` and the rate of a tqdm/Lightning bar
(``2.54s/it``, ``12.00it/s``: tqdm smooths it). DeepSpeed's ``time (ms) | fwd: ...`` lines carry no step number and
its ``samples/sec`` needs the batch size, so neither gives a step time (and a timer line is never a step line).

Known ambiguity: a tqdm/Lightning bar (``Epoch 0: 10%|...| 120/1200``) counts batches within the epoch, so its
``step`` goes back to 0 each epoch; compare ``(epoch, step)`` for such marks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from activities.logs.line import LogLine, split_prefix
from workflows.domain.base import Frozen

__all__ = [
    "CHECKPOINT_RULES",
    "CheckpointMark",
    "CheckpointRule",
    "MAX_STEP_TIME_S",
    "NOT_PROGRESS",
    "ProgressFinding",
    "STEP_RULES",
    "STEP_TIME_RULES",
    "StepMark",
    "StepRule",
    "StepTimeRule",
    "StepTimes",
    "find_progress",
    "parse_checkpoint",
    "parse_step",
    "parse_step_times",
]

_MAX_TEXT = 300
_MAX_DIGITS = 18


@dataclass(frozen=True, slots=True)
class StepRule:
    name: str
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class CheckpointRule:
    name: str
    pattern: re.Pattern[str]
    found: bool
    """False for lines saying there was no checkpoint to load."""


class StepTimes(NamedTuple):
    step_time_s: float | None
    compute_time_s: float | None


@dataclass(frozen=True, slots=True)
class StepTimeRule:
    name: str
    pattern: re.Pattern[str]
    """A ``value`` group and an optional ``unit`` group (``s``, ``ms``, ``s/it``, ``it/s``)."""
    field: Literal["step_time_s", "compute_time_s"]
    unit: str = "s"
    """The unit when the line names none."""
    step_rules: frozenset[str] = frozenset()
    """The ``STEP_RULES`` whose lines this rule reads; empty for any."""


class _Mark(Frozen):
    rule: str
    text: str
    path: str
    offset: int
    rank: int | None = None
    at: datetime | None = None


class StepMark(_Mark):
    """A line that reports a training step (an optimizer step, iteration or batch) done."""

    step: int
    total: int | None = None
    epoch: int | None = None
    step_time_s: float | None = None
    """Seconds the step took, when the line says (see ``STEP_TIME_RULES``)."""
    compute_time_s: float | None = None
    """Seconds of this rank's own work before the gradient collective, when the line says."""


class CheckpointMark(_Mark):
    """A line that says which checkpoint the job loaded, or that it found none."""

    loaded: str | None
    """The checkpoint's name or path as the line gives it; ``""`` when loaded but unnamed; None when none found."""
    step: int | None = None
    """The step the checkpoint holds, when the line says."""

    @property
    def found(self) -> bool:
        return self.loaded is not None


class ProgressFinding(Frozen):
    """What a batch of lines says about progress."""

    step: int | None = None
    """The highest step among each file's latest step line."""
    last: StepMark | None = None
    """The step line ``step`` comes from."""
    checkpoint: CheckpointMark | None = None
    """The latest checkpoint line (by timestamp, else by order)."""
    resumed: StepMark | None = None
    """The earliest step line that follows a checkpoint line in the same file: the job trains again."""
    resumed_from: CheckpointMark | None = None
    """The checkpoint line before ``resumed``; ``resumed_from.found`` is False for a restart from scratch."""


def _s(name: str, regex: str) -> StepRule:
    return StepRule(name, re.compile(regex, re.IGNORECASE))


def _c(name: str, regex: str, *, found: bool = True) -> CheckpointRule:
    return CheckpointRule(name, re.compile(regex, re.IGNORECASE), found)


# ``\s*(?:[:=]\s*)?``, never ``\s*[:=]?\s*``: two adjacent ``\s*`` backtrack quadratically over a run of
# blanks (16k blanks took 1.8 s, measured; a 1 MiB line would take hours).
STEP_RULES: tuple[StepRule, ...] = (
    # Megatron-LM: " iteration      120/    1000 | consumed samples: ..."
    _s("megatron", r"\biteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|"),
    # Lightning's bar: "Epoch 0:  10%|█         | 120/1200 [00:10<01:30, ...]"
    _s("lightning_bar", r"\bEpoch (?P<epoch>\d+):\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)"),
    # A bare tqdm bar (HF Trainer's counts optimizer steps): " 10%|█         | 120/1200 [00:10<01:30, ...]"
    _s("tqdm_bar", r"^\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\["),
    _s("global_step", r"(?<![\w.])global[_ ]step\s*(?:[:=]\s*)?(?P<step>\d+)"),
    _s("iteration", r"(?<![\w.])(?:iteration|iter)\s*(?:[:=]\s*)?(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?"),
    # "step=120", "step 120", "Step 120/1000", "step: 120"; not "steps=" or "step_time=".
    _s("step", r"(?<![\w.])step\s*(?:[:=]\s*)?(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?"),
)

# Atomic: "0.215sec" must not match as "0" followed by something else.
_NUM = r"(?P<value>(?>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))"
STEP_TIME_RULES: tuple[StepTimeRule, ...] = (
    # Ours (deploy/demo/train.py) and key=value loggers: "step_time=0.215s", "'step_time': 0.215", "step_time=215ms".
    StepTimeRule(
        "step_time",
        re.compile(r"(?<![\w.])(?:step_time|time_per_step)['\"]?\s*[:=]\s*" + _NUM + r"\s*(?P<unit>ms|s)?(?![\w/])"),
        "step_time_s",
    ),
    StepTimeRule(
        "compute_time",
        re.compile(r"(?<![\w.])compute_time['\"]?\s*[:=]\s*" + _NUM + r"\s*(?P<unit>ms|s)?(?![\w/])"),
        "compute_time_s",
    ),
    # Megatron-LM: "elapsed time per iteration (ms): 1234.5 |", newer ones "... (ms): 1234.5/1200.3 |" (now/mean).
    StepTimeRule("megatron", re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM), "step_time_s", "ms"),
    # nanoGPT: "iter 120: loss 2.3100, time 123.45ms, mfu 30.12%".
    StepTimeRule(
        "iter_time",
        re.compile(r"(?<![\w.])time\s*(?:[:=]\s*)?" + _NUM + r"\s*(?P<unit>ms|s)(?![\w/])"),
        "step_time_s",
        step_rules=frozenset({"iteration"}),
    ),
    # tqdm's rate inside the bar's brackets: "[00:18<31:07,  2.54s/it, loss=...]" or "[00:10<01:30, 12.00it/s]".
    # No "[" or a second "<" inside: from every "[" the match attempt then ends at the next one (linear, not quadratic).
    StepTimeRule(
        "bar_rate",
        re.compile(r"\[[^\]\[<]*<[^\]\[,]*,\s*" + _NUM + r"(?P<unit>s/it|it/s)"),
        "step_time_s",
        step_rules=frozenset({"lightning_bar", "tqdm_bar"}),
    ),
)
#: A step time above this (30 days) is a parse accident, not a measurement.
MAX_STEP_TIME_S = 30 * 24 * 3600.0

NOT_PROGRESS: tuple[re.Pattern[str], ...] = (
    re.compile(r"checkpoint", re.IGNORECASE),
    # DeepSpeed's timers: "time (ms) | fwd: 5722.49 | bwd: 16107.19 | step: 582.04" (a duration, not a step).
    re.compile(r"\btime \(ms\) \|", re.IGNORECASE),
    re.compile(r"\b(?:error|fatal|exception|traceback)\b", re.IGNORECASE),
    re.compile(
        r"\b(?:starting|start|resuming|restarting) (?:from|at) (?:step|iteration)|\bskipping\b|\bwill skip\b", re.I
    ),
)

_NAME = r"['\"]?(?P<name>[^\s'\",;]+)['\"]?"
CHECKPOINT_RULES: tuple[CheckpointRule, ...] = (
    _c(
        "none_found",
        r"\bno (?:valid )?checkpoints? (?:was |were )?found|will not load any checkpoints"
        r"|could not find the metadata file|\bfrom scratch\b",
        found=False,
    ),
    # The demo: "resumed from checkpoint step_000010 (step 10)"; also "Resuming from checkpoint /ckpt/x".
    _c("resumed_from", r"\bresum(?:ed|ing) (?:training )?from (?:the )?checkpoint(?::|\s+at)?(?:\s+" + _NAME + ")?"),
    # Megatron: "successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 1000"
    _c("loaded", r"\b(?:successfully )?loaded (?:the )?checkpoint(?: from)?(?:\s+" + _NAME + ")?"),
    # Lightning: "Restoring states from the checkpoint path at /ckpt/epoch=0-step=100.ckpt"
    _c("lightning_restore", r"\bRestor(?:ing|ed) (?:all )?states from the checkpoint (?:path )?at\s+" + _NAME),
    # HF Trainer: "Continuing training from checkpoint, will skip to saved global_step"
    _c("hf_continue", r"\bContinuing training from checkpoint\b"),
    # "loading checkpoint from /ckpt", "Loading the checkpoint at step 1000"; not HF's "Loading checkpoint
    # shards", which is pretrained weights, not a resume.
    _c(
        "loading",
        r"\bloading (?:the )?checkpoint(?! shards)(?:\s+(?:at step \d+|(?:from\s+|at\s+)?" + _NAME + "))?",
    ),
)

_CKPT_STEP = re.compile(r"(?:(?<![\w.])step|(?<![\w.])iteration|global_step)\s*(?:[:=]\s*)?(\d+)", re.IGNORECASE)
_EPOCH = re.compile(r"(?<![\w.])epoch\s*(?:[:=]\s*)?(\d+)", re.IGNORECASE)


def parse_step(line: LogLine) -> StepMark | None:
    """The training step ``line`` reports, by the first matching rule of ``STEP_RULES``; None if none.

    Args:
        line: One log line.

    Returns:
        The step mark, or None for lines that report no step or match ``NOT_PROGRESS``.
    """
    body = split_prefix(line.text, parse_time=False).body
    if any(p.search(body) for p in NOT_PROGRESS):
        return None
    for rule in STEP_RULES:
        m = rule.pattern.search(body)
        if m is None or _count(m.group("step")) is None:
            continue
        groups = m.groupdict()
        epoch = groups.get("epoch")
        if epoch is None:
            found = _EPOCH.search(body)
            epoch = found.group(1) if found else None
        return StepMark(
            rule=rule.name,
            text=_clip(line.text),
            path=line.path,
            offset=line.offset,
            rank=line.rank,
            at=line.at,
            step=int(groups["step"]),
            total=_count(groups.get("total")),
            epoch=_count(epoch),
            **parse_step_times(rule.name, body)._asdict(),
        )
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
    for rule in STEP_TIME_RULES:
        if rule.field in found or (rule.step_rules and step_rule not in rule.step_rules):
            continue
        m = rule.pattern.search(body)
        if m is None:
            continue
        seconds = _seconds(float(m.group("value")), m.groupdict().get("unit") or rule.unit)
        if seconds is not None:
            found[rule.field] = seconds
    return StepTimes(found.get("step_time_s"), found.get("compute_time_s"))


def _seconds(value: float, unit: str) -> float | None:
    if unit == "it/s":
        value = 1.0 / value if value > 0 else math.inf
    elif unit == "ms":
        value /= 1000.0
    return value if math.isfinite(value) and 0 <= value <= MAX_STEP_TIME_S else None


def parse_checkpoint(line: LogLine) -> CheckpointMark | None:
    """The checkpoint ``line`` says the job loaded (or found none), by ``CHECKPOINT_RULES``; None if unrelated.

    Args:
        line: One log line.

    Returns:
        The checkpoint mark, or None.
    """
    body = split_prefix(line.text, parse_time=False).body
    for rule in CHECKPOINT_RULES:
        m = rule.pattern.search(body)
        if m is None:
            continue
        name = (m.groupdict().get("name") or "").rstrip(".:)]") if rule.found else None
        step = _CKPT_STEP.search(body, m.start())
        return CheckpointMark(
            rule=rule.name,
            text=_clip(line.text),
            path=line.path,
            offset=line.offset,
            rank=line.rank,
            at=line.at,
            loaded=name,
            step=_count(step.group(1)) if step and rule.found else None,
        )
    return None


def find_progress(lines: Iterable[LogLine]) -> ProgressFinding | None:
    """Summarise the step and checkpoint lines among ``lines`` (each file's lines in order, as ``LogTail`` reads).

    ``resumed`` is the latest restart's first step: per file, the first step line after that file's latest
    checkpoint line; then, of those, the earliest one that comes after the latest checkpoint line of any file.
    A data-parallel step completes only once every rank has loaded, so every rank logs its load before any rank
    logs the first step, and steps of older attempts fall before that cutoff. Without timestamps the last such
    pair in input order is taken.

    Args:
        lines: Log lines, possibly of several files.

    Returns:
        None when no line reports a step or a checkpoint; else the finding.
    """
    last_by_path: dict[str, StepMark] = {}
    pending: dict[str, CheckpointMark] = {}
    resumed_by_path: dict[str, tuple[StepMark, CheckpointMark]] = {}
    checkpoint: CheckpointMark | None = None
    for line in lines:
        loaded = parse_checkpoint(line)
        if loaded is not None:
            pending[line.path] = loaded
            resumed_by_path.pop(line.path, None)  # this file restarted: its earlier resume is history
            if checkpoint is None or not _before(loaded, checkpoint):
                checkpoint = loaded
            continue
        mark = parse_step(line)
        if mark is None:
            continue
        last_by_path[line.path] = mark
        after = pending.pop(line.path, None)
        if after is not None:
            resumed_by_path[line.path] = (mark, after)
    if not last_by_path and checkpoint is None:
        return None
    last = max(last_by_path.values(), key=lambda m: m.step, default=None)
    resumed = _latest_resume(list(resumed_by_path.values()), checkpoint)
    return ProgressFinding(
        step=last.step if last else None,
        last=last,
        checkpoint=checkpoint,
        resumed=resumed[0] if resumed else None,
        resumed_from=resumed[1] if resumed else None,
    )


def _latest_resume(
    pairs: list[tuple[StepMark, CheckpointMark]], latest: CheckpointMark | None
) -> tuple[StepMark, CheckpointMark] | None:
    if not pairs or latest is None:
        return None
    cutoff = latest.at
    if cutoff is None or any(step.at is None for step, _ in pairs):
        return pairs[-1]
    current = [pair for pair in pairs if pair[0].at is not None and pair[0].at >= cutoff]
    return min(current, key=lambda pair: pair[0].at or cutoff, default=None)


def _before(a: _Mark, b: _Mark) -> bool:
    """``a`` strictly earlier than ``b`` by their timestamps; False when either has none (keep input order)."""
    return a.at is not None and b.at is not None and a.at < b.at


def _count(digits: str | None) -> int | None:
    """A step, total or epoch number; None for none, or for more digits than an int64 holds (no counter has
    them, and ``int()`` of a long digit string is slow, then a ValueError past 4300 digits)."""
    return int(digits) if digits and len(digits) <= _MAX_DIGITS else None


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"
