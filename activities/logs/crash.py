"""Log lines to findings: the one reader the live watch, the attribution activity and ``rebound diagnose`` share.

The rows live in ``activities.logs.signature_table`` (compiled and matched by ``activities.logs.signatures``).
For each line the **highest-priority** row whose regex matches the line's body (the text after its srun label,
``[rankN]:`` prefix, timestamp and other launcher prefixes) wins: specific srun lines before generic signal words,
CUDA errors before communication errors, communication errors before the catch-all Python exception row (a gloo
``RuntimeError`` is a victim, not a user bug). A row yields one finding, or one per rank when it names a Slurm task
list (``tasks 2-3``).

``LineReader`` reads lines in order and keeps, per (file, rank), what a line is in the middle of, so interleaved
ranks keep separate state:

* a traceback's source lines (the indented line after ``File "...", line N``) are code, not messages: skipped;
* a traceback printed under ``Exception ignored in:`` (a destructor's complaint) is not the job's error: its final
  exception line is dropped (a CUDA error there still counts: it is the device's, not the destructor's);
* once Slurm tears the step down (srun's "Job step aborted", "Terminating StepId", "forcing job termination",
  slurmstepd's "CANCELLED AT"), srun's "task N: Killed" is that teardown's SIGKILL of a task that outlived
  ``KillWait`` (Lightning's SLURM handler ignores SIGTERM): a victim, not a rank that died on its own. Any other
  line of the stream (the next attempt's output) ends the teardown.

What a finding carries is the row's named groups, else what the line says around them:

* ``ranks`` (a task list: ``3``, ``2-3``, ``0,2-5``) or ``rank``; otherwise the line's own rank;
* ``host`` (``node`` here); otherwise the ``%N`` node of the file, a ``slurmstepd-<node>:``, ``host:`` or NCCL
  prefix or a ``node=`` token, unless the row says the line's node is not the one to blame;
* ``exit_code``, ``signal`` (a number or a name such as ``Segmentation fault``), ``xid``, ``gpu``, ``peer_rank``;
* ``exception`` and ``message``; otherwise a leading ``SomeError:`` of the body and the rest of it;
* ``at`` (a timestamp inside the text, e.g. Slurm's ``CANCELLED AT ...``), used when the line has none;
* ``checkpoint`` (a ``checkpoint_load`` finding: the checkpoint the job could not read): the path the failing line
  names, else the one the latest load line of the same (file, rank), or of the same file without a rank, named
  (Lightning's "Restoring states from the checkpoint path at ...", Megatron's "loading checkpoint from ...":
  ``activities.logs.progress``), since torch's own errors name no file.

Roles: a ``CULPRIT`` finding says this rank or node failed by itself; a ``VICTIM`` one that it failed because a
peer did (a gloo/NCCL peer error, srun terminating the survivors); ``INFO`` is context, not a crash. ``kind`` is the
detector's coarse vocabulary (attribution keys on it); ``category`` the library's canonical failure category.
``to_findings`` reduces crash findings to the domain's ``LogFinding``, what attribution reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from activities.logs.line import Line, LinePrefix, LogLine
from activities.logs.progress import parse_checkpoint
from activities.logs.signature_fields import Fields, extract
from activities.logs.signature_types import Category, Prepared, Role, Signature, SignatureMatch
from activities.logs.signatures import SIGNATURES, match, peel, prepare
from activities.logs.terminal import strip_terminal_codes
from workflows.domain.base import Frozen
from workflows.domain.findings import FindingKind
from workflows.domain.incident import Evidence, EvidenceSource, FailureClass, LogFinding

__all__ = [
    "CRASH_RULES",
    "CrashFinding",
    "CrashRule",
    "LineRead",
    "LineReader",
    "classify",
    "crash_findings",
    "scan",
    "to_evidence",
    "to_findings",
]

MAX_TEXT = 300
_MAX_STREAMS = 4096

_FILE_LINE = re.compile(r'^\s+File "')
_IGNORED = re.compile(r"^Exception ignored (?:in|on calling)\b")
# The words of every load line ``parse_checkpoint`` names a checkpoint in: a cheap test before it runs.
_LOAD_HINT = re.compile(r"checkpoint|Resuming training from|Loading model from", re.IGNORECASE)
_LOAD_WORDS = ("checkpoint", "resuming training from", "loading model from")  # ``_LOAD_HINT`` lower-cased
# Slurm tearing a step down: what srun and slurmstepd print once they stop the remaining tasks.
_TEARDOWN = re.compile(
    r"^(?:srun|salloc|yhrun): (?:Job step aborted|forcing job termination|Force Terminated"
    r"|(?:launch/slurm: _step_signal: )?Terminating (?:StepId=|job step ))"
    r"|\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT "
)
# What srun and slurmstepd print: the lines that keep a teardown going (anything else ends it).
_SLURM_LINE = re.compile(r"^(?:(?:srun|salloc|yhrun): |error: \*\*\* (?:JOB|STEP) )")
_TEARDOWN_KILL = "srun_task_killed"
_TRACEBACK_LINE = re.compile(r"^(?:\s|Traceback \(most recent call last\)|During handling|The above exception)")

CrashRule = Signature
"""A row of the table (the detector's historical name for a signature)."""

CRASH_RULES: tuple[Signature, ...] = SIGNATURES


class CrashFinding(Frozen):
    """One log line that says something crashed (or, for ``Role.INFO``, was stopped on purpose)."""

    rule: str
    kind: FindingKind
    failure_class: FailureClass
    role: Role
    culprit: bool
    """``role == Role.CULPRIT``, for readers that only need that."""
    text: str
    """The evidence line, stripped, at most ``MAX_TEXT`` characters."""
    path: str
    offset: int | None = None
    rank: int | None = None
    node: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    exception: str | None = None
    message: str = ""
    xid: int | None = None
    at: datetime | None = None
    category: Category = Category.NONE
    """The canonical failure category (``activities.logs.signature_types.Category``)."""
    restartable: bool | None = None
    """Whether a restart (elsewhere) can help, as far as this line alone says; None: it says nothing."""
    gpu: str | None = None
    """A GPU index or PCI id the line names."""
    peer_rank: int | None = None
    checkpoint: str | None = None
    """The checkpoint a ``checkpoint_load`` finding could not read, when the log names it (module docstring)."""
    task: int | None = None
    """The Slurm task that wrote the line (srun ``--label``) or that srun's own line names (``task 6: ...``)."""
    rank_is_task: bool = False
    """``rank`` is that Slurm task id, not a rank the line names (``activities.logs.line``)."""


class LineRead(NamedTuple):
    """One line as the reader understood it: its prefixes peeled off, and the row that matched it, if any."""

    prep: Prepared
    hit: SignatureMatch | None
    """None for an ordinary line, and for a line the multi-line context says is not a message."""
    fields: Fields | None
    """What the matched line implicates (``signatures.extract``); None without a match."""
    checkpoint: str | None = None
    """For a checkpoint load failure, the checkpoint it names or the latest one its stream said it loads."""
    teardown_kill: bool = False
    """srun's "Killed" for a task, read while Slurm tears the step down: the teardown's SIGKILL, a victim."""


class _Stream:
    """What one (file, rank) is in the middle of: a traceback's source line, an ignored exception, a teardown."""

    __slots__ = ("after_file_line", "checkpoint", "ignoring", "teardown")

    def __init__(self) -> None:
        self.after_file_line = False
        self.ignoring = False
        self.teardown = False
        self.checkpoint: str | None = None
        """The checkpoint the stream's latest load line named."""


def _load_hint(body: str) -> bool:
    """``_LOAD_HINT.search(body)``; an ASCII body is tested by its words (a case-insensitive literal matches an ASCII
    text exactly where the lower-cased literal is in the lower-cased text)."""
    if body.isascii():
        low = body.lower()
        return any(word in low for word in _LOAD_WORDS)
    return _LOAD_HINT.search(body) is not None


class LineReader:
    """Reads lines in the order they were written and says what each means (module docstring). Memory is bounded."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, int | None], _Stream] = {}

    def read(
        self,
        path: str,
        text: str,
        *,
        rank: int | None = None,
        host: str | None = None,
        prefix: LinePrefix | None = None,
    ) -> LineRead:
        """What ``text``, the next line of ``path``, says.

        Args:
            path: The file (or source) the line is from.
            text: The line as written.
            rank: The rank the caller already knows for the line (from its file's name), preferred to its prefixes'.
            host: The node the caller already knows (``%N`` in a file pattern), preferred to its prefixes'.
            prefix: The line's first prefixes, when already peeled (``Line.prefix``).
        """
        prep = prepare(text) if prefix is None else peel(prefix)
        body = prep.body
        stream = self._stream(path, rank if rank is not None else prep.rank)
        code_line = stream.after_file_line and body[:1] in (" ", "\t")
        stream.after_file_line = _FILE_LINE.match(body) is not None
        if code_line:
            return LineRead(prep, None, None)
        if _IGNORED.match(body):
            stream.ignoring = True
            return LineRead(prep, None, None)
        if _TEARDOWN.search(body):
            stream.teardown = True
        elif stream.teardown and not _SLURM_LINE.match(body):
            stream.teardown = False
        hit = match(body)
        if hit is not None and stream.teardown and hit.signature.id == _TEARDOWN_KILL:
            return LineRead(prep, hit, extract(hit, prep, rank=rank, host=host), teardown_kill=True)
        if stream.ignoring:
            if hit is not None and hit.category is Category.USER_EXCEPTION:
                stream.ignoring = False
                return LineRead(prep, None, None)
            if not _TRACEBACK_LINE.match(body):
                stream.ignoring = False
        if hit is None:
            if _load_hint(body):
                loaded = parse_checkpoint(LogLine(path=path, rank=None, text=body, offset=0))
                if loaded is not None and loaded.loaded:
                    stream.checkpoint = loaded.loaded
            return LineRead(prep, None, None)
        fields = extract(hit, prep, rank=rank, host=host)
        if hit.signature.kind is not FindingKind.CHECKPOINT_LOAD:
            return LineRead(prep, hit, fields)
        named = hit.groups.get("checkpoint") or hit.groups.get("checkpoint_file")
        return LineRead(prep, hit, fields, (named.rstrip(".:)]") if named else None) or self._loaded(path, stream))

    def classify(self, line: LogLine | Line) -> list[CrashFinding]:
        """What ``line`` (the next line of its file) says crashed; see ``classify``."""
        prefix = line.prefix if isinstance(line, Line) else None
        return crash_findings(line, self.read(line.path, line.text, rank=line.rank, host=line.node, prefix=prefix))

    def scan(self, lines: Iterable[LogLine | Line]) -> list[CrashFinding]:
        """``classify`` every line, in order."""
        return [finding for line in lines for finding in self.classify(line)]

    def _loaded(self, path: str, stream: _Stream) -> str | None:
        """The checkpoint ``stream`` last said it loads, else what a rank-less line of the same file said (a trainer
        that logs its load on rank 0 only, without a rank prefix, speaks for every rank)."""
        shared = self._streams.get((path, None))
        return stream.checkpoint or (shared.checkpoint if shared is not None else None)

    def _stream(self, path: str, rank: int | None) -> _Stream:
        key = (path, rank)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= _MAX_STREAMS:
                self._streams.clear()  # bounded memory: a pathological log loses only multi-line context
            stream = self._streams[key] = _Stream()
        return stream


def crash_findings(line: LogLine | Line, read: LineRead) -> list[CrashFinding]:
    """The findings of one read line: none for an ordinary line, one per rank for a row naming a task list, else one."""
    hit, f = read.hit, read.fields
    if hit is None or f is None:
        return []
    # An informational row says nothing of the class; the detector's findings always carry one.
    failure_class = hit.failure_class or FailureClass.UNKNOWN
    base = CrashFinding(
        rule=hit.signature.id,
        kind=hit.signature.kind,
        failure_class=failure_class,
        role=Role.VICTIM if read.teardown_kill else hit.role,
        culprit=hit.role is Role.CULPRIT and not read.teardown_kill,
        text=_clip(strip_terminal_codes(line.text).strip()),  # evidence shows the line, not its colours
        path=line.path,
        offset=line.offset,
        rank=f.rank,
        node=f.host,
        exit_code=f.exit_code,
        signal=f.signal,
        exception=f.exception,
        message=_clip(f.message),
        xid=f.xid,
        at=line.at or _timestamp(hit.groups.get("at")),
        category=hit.category,
        restartable=hit.restartable,
        gpu=f.gpu,
        peer_rank=f.peer_rank,
        checkpoint=read.checkpoint,
        task=line.task,
        rank_is_task=line.rank_is_task and f.rank == line.rank,
    )
    if f.ranks is None:
        return [base]
    if not f.ranks:
        return [base.model_copy(update={"rank": None})]
    # srun's own lines name Slurm tasks ("task 6: Exited ..."): a rank only when the job runs one task per rank.
    return [base.model_copy(update={"rank": rank, "task": rank, "rank_is_task": True}) for rank in f.ranks]


def classify(line: LogLine) -> list[CrashFinding]:
    """What ``line`` says crashed, by the highest-priority matching row of ``CRASH_RULES``, on its own.

    Args:
        line: One log line, as ``LogTail`` returns it.

    Returns:
        No finding for an ordinary line; one per rank for a row naming a task list; else one.
    """
    return LineReader().classify(line)


def scan(lines: Iterable[LogLine | Line]) -> list[CrashFinding]:
    """Every line's findings, in order, read by one ``LineReader`` (the lines' multi-line context counts)."""
    return LineReader().scan(lines)


def to_findings(found: Sequence[CrashFinding], start_order: int = 0) -> list[LogFinding]:
    """Crash findings reduced to what attribution needs, numbered in reading order.

    Informational findings (a task stopped by a requeue, a cancellation) are not crashes and are dropped.
    """
    return [
        LogFinding(
            kind=f.kind,
            rank=f.rank,
            node=f.node or "",
            exception=f.exception or "",
            at=f.at,
            order=start_order + i,
            text=f.text,
            culprit=f.culprit,
            failure_class=f.failure_class,
            checkpoint=f.checkpoint or "",
            task=f.task,
            rank_is_task=f.rank_is_task,
            signal=f.signal,
        )
        for i, f in enumerate(f for f in found if f.role is not Role.INFO)
    ]


def to_evidence(finding: CrashFinding) -> Evidence:
    """The finding as domain ``Evidence``: the verbatim line with its rank, node and time."""
    return Evidence(
        source=EvidenceSource.LOGS, text=finding.text, node=finding.node or "", rank=finding.rank, at=finding.at
    )


def _timestamp(text: str | None) -> datetime | None:
    """Slurm's ``2026-11-30T03:47:28`` (taken as UTC: Slurm prints its host's local time, UTC on our clusters)."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
