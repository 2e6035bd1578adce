"""Crash evidence in log lines: what the signature library says each line means, as the live detector needs it.

The rows themselves live in ``activities.logs.signatures`` (``SIGNATURES``, re-exported here as ``CRASH_RULES``):
one table of truth for this detector and for ``rebound diagnose``. For each line the **highest-priority** row
whose regex matches the line's body (the text after its srun label, ``[rankN]:`` prefix, timestamp and other
launcher prefixes) wins: specific srun lines before generic signal words, CUDA errors before communication
errors, communication errors before the catch-all Python exception row (a gloo ``RuntimeError`` is a victim, not a
user bug). A row yields one finding, or one per rank when it names a Slurm task list (``tasks 2-3``).

What a finding carries is the row's named groups, else what the line says around them:

* ``ranks`` (a task list: ``3``, ``2-3``, ``0,2-5``) or ``rank``; otherwise the line's own rank;
* ``host`` (``node`` here); otherwise the ``%N`` node of the file, a ``slurmstepd-<node>:``, ``host:`` or NCCL
  prefix or a ``node=`` token, unless the row says the line's node is not the one to blame;
* ``exit_code``, ``signal`` (a number or a name such as ``Segmentation fault``), ``xid``, ``gpu``, ``peer_rank``;
* ``exception`` and ``message``; otherwise a leading ``SomeError:`` of the body and the rest of it;
* ``at`` (a timestamp inside the text, e.g. Slurm's ``CANCELLED AT ...``), used when the line has none.

Roles: a ``CULPRIT`` finding says this rank or node failed by itself; a ``VICTIM`` one that it failed because a
peer did (a gloo/NCCL peer error, srun terminating the survivors); ``INFO`` is context, not a crash. ``kind`` is the
detector's coarse vocabulary (attribution keys on it); ``category`` the library's canonical failure category.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from activities.logs.signatures import SIGNATURES, Category, Role, Signature, extract, match, prepare
from activities.logs.tail import LogLine
from workflows.domain.base import Frozen
from workflows.domain.findings import FindingKind
from workflows.domain.incident import Evidence, EvidenceSource, FailureClass

__all__ = [
    "CRASH_RULES",
    "CrashFinding",
    "CrashRule",
    "Role",
    "classify",
    "scan",
    "to_evidence",
]

MAX_TEXT = 300

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
    """The canonical failure category (``activities.logs.signatures.Category``)."""
    restartable: bool | None = None
    """Whether a restart (elsewhere) can help, as far as this line alone says; None: it says nothing."""
    gpu: str | None = None
    """A GPU index or PCI id the line names."""
    peer_rank: int | None = None


def classify(line: LogLine) -> list[CrashFinding]:
    """What ``line`` says crashed, by the highest-priority matching row of ``CRASH_RULES``.

    Args:
        line: One log line, as ``LogTail`` returns it.

    Returns:
        No finding for an ordinary line; one per rank for a row naming a task list; else one.
    """
    prep = prepare(line.text)
    hit = match(prep.body)
    if hit is None:
        return []
    f = extract(hit, prep, rank=line.rank, host=line.node)
    # An informational row says nothing of the class; the detector's findings always carry one.
    failure_class = hit.failure_class or FailureClass.UNKNOWN
    base = CrashFinding(
        rule=hit.signature.id,
        kind=hit.signature.kind,
        failure_class=failure_class,
        role=hit.role,
        culprit=hit.role is Role.CULPRIT,
        text=_clip(line.text.strip()),
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
    )
    if f.ranks is None:
        return [base]
    if not f.ranks:
        return [base.model_copy(update={"rank": None})]
    return [base.model_copy(update={"rank": rank}) for rank in f.ranks]


def scan(lines: Iterable[LogLine]) -> list[CrashFinding]:
    """``classify`` every line, in order."""
    return [finding for line in lines for finding in classify(line)]


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
