"""Training progress in log lines: step counters and checkpoint loads, to tell that a job resumed.

Two tables, each tried in order with the first match winning: ``STEP_RULES`` (a regex with a ``step`` group and
optional ``total``/``epoch`` groups) and ``CHECKPOINT_RULES`` (``name`` and ``step`` groups, and whether the line
means a checkpoint was found). ``NOT_PROGRESS`` lists what makes a line with a step number not a progress line:
a checkpoint save names the step it saved, a crash report the step it died in, a plan the step it will start at.

A checkpoint line is never also a step line. Regexes run on the line's body (after its srun label, ``[rankN]:``
prefix and timestamp).

Known ambiguity: a tqdm/Lightning bar (``Epoch 0: 10%|...| 120/1200``) counts batches within the epoch, so its
``step`` goes back to 0 each epoch; compare ``(epoch, step)`` for such marks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from activities.logs.tail import LogLine, split_prefix
from workflows.domain.base import Frozen

__all__ = [
    "CHECKPOINT_RULES",
    "CheckpointMark",
    "CheckpointRule",
    "NOT_PROGRESS",
    "ProgressFinding",
    "STEP_RULES",
    "StepMark",
    "StepRule",
    "find_progress",
    "parse_checkpoint",
    "parse_step",
]

_MAX_TEXT = 300


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


STEP_RULES: tuple[StepRule, ...] = (
    # Megatron-LM: " iteration      120/    1000 | consumed samples: ..."
    _s("megatron", r"\biteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|"),
    # Lightning's bar: "Epoch 0:  10%|█         | 120/1200 [00:10<01:30, ...]"
    _s("lightning_bar", r"\bEpoch (?P<epoch>\d+):\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)"),
    # A bare tqdm bar (HF Trainer's counts optimizer steps): " 10%|█         | 120/1200 [00:10<01:30, ...]"
    _s("tqdm_bar", r"^\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\["),
    _s("global_step", r"(?<![\w.])global[_ ]step\s*[:=]?\s*(?P<step>\d+)"),
    _s("iteration", r"(?<![\w.])(?:iteration|iter)\s*[:=]?\s*(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?"),
    # "step=120", "step 120", "Step 120/1000", "step: 120"; not "steps=" or "step_time=".
    _s("step", r"(?<![\w.])step\s*[:=]?\s*(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?"),
)

NOT_PROGRESS: tuple[re.Pattern[str], ...] = (
    re.compile(r"checkpoint", re.IGNORECASE),
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

_CKPT_STEP = re.compile(r"(?:(?<![\w.])step|(?<![\w.])iteration|global_step)\s*[:=]?\s*(\d+)", re.IGNORECASE)
_EPOCH = re.compile(r"(?<![\w.])epoch\s*[:=]?\s*(\d+)", re.IGNORECASE)


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
        if m is None:
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
            total=int(groups["total"]) if groups.get("total") else None,
            epoch=int(epoch) if epoch is not None else None,
        )
    return None


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
            step=int(step.group(1)) if step and rule.found else None,
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


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"
