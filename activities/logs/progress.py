"""Training progress in log lines: step counters and checkpoint loads, to tell that a job resumed.

The tables live in ``activities.logs.progress_rules``; each is tried in order with the first match winning:
``STEP_RULES`` (a regex with a ``step`` group and optional ``total``/``epoch`` groups) and ``CHECKPOINT_RULES``
(``name`` and ``step`` groups, and whether the line means a checkpoint was found). ``NOT_PROGRESS`` lists what makes
a line with a step number not a progress line: a checkpoint save names the step it saved, a crash report the step
it died in, a plan the step it will start at.

A checkpoint line is never also a step line. Regexes run on the line's body (after its srun label, ``[rankN]:``
prefix and timestamp), with terminal colour codes removed (torchtitan colours its step line).

Progress bars (tqdm, Lightning): ``LogTail`` hands over every ``\\r``-separated redraw as its own line (with its
own byte offset), so the latest complete frame is the current progress. tqdm writes ``\\r`` before a frame, so a
frame is complete once the next one (or the bar's closing newline) begins; the newest frame shows one redraw late.
A frame is a trained step only when it counted something since the bar began:

* a frame at 0 (``0/100000 [00:00<?, ?it/s]``, every bar's first frame, each Lightning epoch's first) is no step;
* a frame drawn before the bar counted anything (tqdm prints no rate and no time left, ``<?``) at a count k > 0 is
  the bar's starting point: a loop that resumed at step k and starts its bar there (``tqdm(initial=k)``:
  ``180/100000 [00:00<?, ?it/s]``). It is read as the resume point, a checkpoint line with step k (rule
  ``bar_start``), never as step k trained. HF Trainer's own bar starts at 0 after a resume and jumps to the first
  step trained (global step k + 1), which then is the first trained step.

Lines that detail a load (``CheckpointRule.detail``: HF's "Continuing training from global step 180", torchtitan's
"Finished loading the checkpoint in ...", a bar's starting point) fill in the step of the file's pending load line
instead of replacing it, so the checkpoint keeps its name and gets its step.

Step lines may also say how long the step took (``STEP_TIME_RULES``, first match per field): ``step_time`` is the
whole step (compute, collectives, optimizer; in synchronous data parallelism the same on every rank) and
``compute_time`` a rank's own work before the gradient collective (where a straggler shows). Formats: ours
(``step_time=0.215s compute_time=0.180s``), Megatron-LM's ``elapsed time per iteration (ms): 1234.5`` (an average
over its log interval), NeMo 2's ``train_step_timing in s: 0.031``, DeepSpeed's pipeline ``iter time (s): 0.123``,
nanoGPT's ``iter 120: loss 2.31, time 123.45ms`` and the rate of a tqdm/Lightning bar (``2.54s/it``,
``12.00it/s``: tqdm smooths it). DeepSpeed's ``time (ms) | fwd: ...`` lines carry no step number and its
``samples/sec`` needs the batch size, so neither gives a step time (and a timer line is never a step line).

HF Trainer's loss dicts (``{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}``) name no step:
they are no step line, but they prove training ran (``ProgressFinding.trained``).

Known ambiguity: a Lightning bar (``Epoch 0: 10%|...| 120/1200``) counts batches within the epoch, so its
``step`` goes back to 0 each epoch (``StepMark.per_epoch``); compare ``(epoch, step)`` for such marks, never with a
checkpoint's global step.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from activities.logs.line import LogLine
from activities.logs.progress_rules import (
    BAR_NOT_STARTED,
    CHECKPOINT_RULES,
    CHECKPOINT_STEP,
    CHECKPOINT_WORDS,
    NOT_PROGRESS,
    STEP_RULES,
    STEP_TIME_RULES,
    TRAINING_LOG,
    CheckpointRule,
    StepRule,
    StepTimeRule,
)
from activities.logs.step_line import (
    MAX_DIGITS,
    MAX_STEP_TIME_S,
    StepTimes,
    count,
    line_body,
    not_progress,
    parse_step_times,
    step_fields,
    step_match,
)
from activities.logs.terminal import strip_terminal_codes
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
    "TrainingMark",
    "find_progress",
    "parse_checkpoint",
    "parse_step",
    "parse_step_times",
    "parse_training",
]

_MAX_TEXT = 300
_DETAIL_RULES = frozenset(rule.name for rule in CHECKPOINT_RULES if rule.detail) | {"bar_start"}


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
    zero_based: bool = False
    """The line numbers steps from 0 (nanoGPT's ``iter 0``, NeMo's ``global_step: 0`` is the first step trained)."""
    per_epoch: bool = False
    """``step`` counts batches within ``epoch`` (Lightning's bar), not steps since the start: it cannot be compared
    with a checkpoint's global step."""

    @property
    def steps_done(self) -> int:
        """Steps done once this one is: ``step``, or ``step + 1`` for a 0-based count. After a resume from a
        checkpoint that holds N steps, the first step trained has ``steps_done == N + 1``."""
        return self.step + 1 if self.zero_based else self.step


class CheckpointMark(_Mark):
    """A line that says which checkpoint the job loaded, or that it found none."""

    loaded: str | None
    """The checkpoint's name or path as the line gives it; ``""`` when loaded but unnamed; None when none found."""
    step: int | None = None
    """The step the checkpoint holds, when the line (or a line detailing it, ``CheckpointRule.detail``) says."""

    @property
    def found(self) -> bool:
        return self.loaded is not None


class TrainingMark(_Mark):
    """A line that shows training ran without naming a step (HF Trainer's loss dict, ``TRAINING_LOG``)."""

    epoch: float | None = None
    """The fractional epoch the line gives."""


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
    trained: TrainingMark | None = None
    """The latest line that shows training ran but names no step (HF's ``{'loss': ..., 'epoch': ...}``)."""
    trained_since_checkpoint: bool = False
    """A step line or a ``trained`` line follows, in its file, the latest checkpoint line: the job trained after
    its latest load, even one that prints no step line."""


def parse_step(line: LogLine) -> StepMark | None:
    """The training step ``line`` reports, by the first matching rule of ``STEP_RULES``; None if none.

    Args:
        line: One log line.

    Returns:
        The step mark, or None for lines that report no step, match ``NOT_PROGRESS``, or are a progress bar's
        frame that counted nothing yet (module docstring).
    """
    fields = step_fields(line_body(line.text))
    if fields is None:
        return None
    rule = fields.rule
    return StepMark(
        rule=rule.name,
        text=_clip(line.text),
        path=line.path,
        offset=line.offset,
        rank=line.rank,
        at=line.at,
        step=fields.step,
        total=fields.total,
        epoch=fields.epoch,
        zero_based=rule.zero_based,
        per_epoch=rule.per_epoch,
        step_time_s=fields.step_time_s,
        compute_time_s=fields.compute_time_s,
    )


def parse_checkpoint(line: LogLine) -> CheckpointMark | None:
    """The checkpoint ``line`` says the job loaded (or found none), by ``CHECKPOINT_RULES``; None if unrelated.

    A progress bar's starting point after a resume (``180/100000 [00:00<?, ?it/s]``) is a checkpoint mark too:
    rule ``bar_start``, unnamed, with the bar's count as its step.

    Args:
        line: One log line.

    Returns:
        The checkpoint mark, or None.
    """
    body = line_body(line.text)
    lowered = body.lower()
    if not any(word in lowered for word in CHECKPOINT_WORDS):
        start = _bar_start(body)
        return _checkpoint_mark(line, "bar_start", "", start) if start is not None else None
    for rule in CHECKPOINT_RULES:
        m = rule.pattern.search(body)
        if m is None:
            continue
        name = (m.groupdict().get("name") or "").rstrip(".:)]") if rule.found else None
        step = CHECKPOINT_STEP.search(body, m.start())
        digits = (step.group(1) or step.group(2)) if step else None
        return _checkpoint_mark(line, rule.name, name, count(digits) if rule.found else None)
    start = _bar_start(body)
    return _checkpoint_mark(line, "bar_start", "", start) if start is not None else None


def _bar_start(body: str) -> int | None:
    """The count a progress bar frame shows before it counted anything, when above 0 (module docstring)."""
    if "<?" not in body:
        return None  # the cheap test first: most lines are no such frame
    low = body.lower() if body.isascii() else None
    if not_progress(body, low):
        return None
    found = step_match(body, low)
    if found is None or not found[0].bar:
        return None
    step = int(found[1].group("step"))
    return step if step > 0 and BAR_NOT_STARTED.search(body, found[1].end("step")) is not None else None


def _checkpoint_mark(line: LogLine, rule: str, loaded: str | None, step: int | None) -> CheckpointMark:
    return CheckpointMark(
        rule=rule,
        text=_clip(line.text),
        path=line.path,
        offset=line.offset,
        rank=line.rank,
        at=line.at,
        loaded=loaded,
        step=step,
    )


def parse_training(line: LogLine) -> TrainingMark | None:
    """A line that shows training ran without naming a step (``TRAINING_LOG``); None otherwise."""
    body = line_body(line.text)
    m = TRAINING_LOG.search(body)
    if m is None:
        return None
    epoch = float(m.group("epoch")) if len(m.group("epoch")) <= MAX_DIGITS else None
    return TrainingMark(
        rule="hf_training_log",
        text=_clip(line.text),
        path=line.path,
        offset=line.offset,
        rank=line.rank,
        at=line.at,
        epoch=epoch,
    )


def find_progress(lines: Iterable[LogLine]) -> ProgressFinding | None:
    """Summarise the step and checkpoint lines among ``lines`` (each file's lines in order, as ``LogTail`` reads).

    ``resumed`` is the latest restart's first step: per file, the first step line after that file's latest
    checkpoint line; then, of those, the earliest one that comes after the latest checkpoint line of any file.
    A data-parallel step completes only once every rank has loaded, so every rank logs its load before any rank
    logs the first step, and steps of older attempts fall before that cutoff. Without timestamps the last such
    pair in input order is taken. A line that details a load (``CheckpointRule.detail``) fills in the step of its
    file's pending load line rather than counting as a load of its own.

    Args:
        lines: Log lines, possibly of several files.

    Returns:
        None when no line reports a step, a checkpoint or training; else the finding.
    """
    last_by_path: dict[str, StepMark] = {}
    pending: dict[str, CheckpointMark] = {}
    resumed_by_path: dict[str, tuple[StepMark, CheckpointMark]] = {}
    checkpoint: CheckpointMark | None = None
    trained: TrainingMark | None = None
    trained_since: dict[str, bool] = {}
    for line in lines:
        loaded = parse_checkpoint(line)
        if loaded is not None:
            before = pending.get(line.path)
            if loaded.rule in _DETAIL_RULES and before is not None and before.found:
                loaded = before.model_copy(update={"step": before.step if before.step is not None else loaded.step})
                if checkpoint is before:
                    checkpoint = loaded
                pending[line.path] = loaded
                continue
            pending[line.path] = loaded
            trained_since[line.path] = False
            resumed_by_path.pop(line.path, None)  # this file restarted: its earlier resume is history
            if checkpoint is None or not _before(loaded, checkpoint):
                checkpoint = loaded
            continue
        mark = parse_step(line)
        if mark is None:
            training = parse_training(line)
            if training is not None:
                trained = training
                trained_since[line.path] = True
            continue
        last_by_path[line.path] = mark
        trained_since[line.path] = True
        after = pending.pop(line.path, None)
        if after is not None:
            resumed_by_path[line.path] = (mark, after)
    if not last_by_path and checkpoint is None and trained is None:
        return None
    last = max(last_by_path.values(), key=lambda m: m.step, default=None)
    resumed = _latest_resume(list(resumed_by_path.values()), checkpoint)
    return ProgressFinding(
        step=last.step if last else None,
        last=last,
        checkpoint=checkpoint,
        resumed=resumed[0] if resumed else None,
        resumed_from=resumed[1] if resumed else None,
        trained=trained,
        trained_since_checkpoint=checkpoint is not None and trained_since.get(checkpoint.path, False),
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
    text = strip_terminal_codes(text).strip()
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"
