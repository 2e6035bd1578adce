"""What ``rebound diagnose`` says about a failed job's logs: the root cause, every finding, their evidence lines.

The models ``activities.logs.diagnose.Diagnoser`` returns (and ``rebound diagnose --json`` prints), and the one
spelling of a GPU that the logs, the corpus labels and the diagnosis share (``normalize_gpu``).
"""

from __future__ import annotations

import re

from pydantic import Field

from activities.logs.signature_types import Category, Role
from workflows.domain.base import Frozen
from workflows.domain.incident import Attribution, FailureClass

__all__ = ["Diagnosis", "EvidenceLine", "Finding", "normalize_gpu"]

_PCI = re.compile(r"^(?:pci:)?(?:[0-9a-f]{4})?([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")


class EvidenceLine(Frozen):
    path: str
    line: int
    """1-based line number in ``path``."""
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


class Finding(Frozen):
    """Everything the logs say about one failure category: the best line's fields, and where it was seen."""

    category: Category
    signature: str
    """The id of the row that matched the representative line."""
    failure_class: FailureClass | None
    restartable: bool | None
    """Whether a restart (elsewhere) can help; None when the category says nothing (``none``)."""
    role: Role
    confidence: float = Field(ge=0, le=1)
    rank: int | None = None
    host: str | None = None
    gpu: int | str | None = None
    """A GPU index, or a PCI id (``0000:3b:00.0``)."""
    peer_rank: int | None = None
    xid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    exception: str | None = None
    message: str = ""
    detail: str = ""
    """Why, where the table alone does not say: the XID catalog's meaning and recommended action."""
    ranks: tuple[int, ...] = ()
    """Every rank that reported it (sorted)."""
    hosts: tuple[str, ...] = ()
    lines: int = 0
    """Lines that matched."""
    weak: bool = False
    """Only catch-all rows matched (an unknown exception type, a CUDA error without a known name)."""
    evidence: tuple[EvidenceLine, ...] = ()


class Diagnosis(Frozen):
    """The root cause (``primary``) and everything else found, strongest first."""

    category: Category
    failure_class: FailureClass | None
    """The root cause's category's class (``signatures.CATEGORIES``); the decision is ``attribution``'s."""
    restartable: bool | None
    confidence: float = Field(ge=0, le=1)
    primary: Finding | None = None
    findings: tuple[Finding, ...] = ()
    lines_read: int = 0
    sources: tuple[str, ...] = ()
    attribution: Attribution | None = None
    """What a live recovery's attribution concludes from these logs alone (no node states, no GPU agents): the
    same ``workflows.policy.attribution.attribute`` the ``attribute_failure`` activity calls. None when nothing
    was found."""

    @property
    def failed(self) -> bool:
        return self.category is not Category.NONE


def normalize_gpu(value: str | int) -> int | str:
    """A GPU as an index (``3``) or a canonical PCI id (``0000:3b:00.0``): what the logs and labels spell apart.

    ``0000:3B:00`` (NVRM), ``00000000:3B:00.0`` (nvidia-smi) and ``PCI:0000:3b:00.0`` are one GPU.
    """
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    m = _PCI.match(text.lower())
    if m is None:
        return text
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4) or '0'}"
