"""NVIDIA's NVSwitch SXid table, loaded from the packaged TSV (``sxid_catalog.tsv``) into an ``SxidCatalog``.

Each row: the SXid, its name, NVIDIA's section of the Fabric Manager User Guide's SXid appendix (non-fatal,
fatal = potentially fatal, always fatal, other notable), the severity Rebound gives it (``KernelSeverity``), NVIDIA's
recovery and where the row came from (``source``). The line's own Fatal/Non-fatal label outranks the section
(``activities.kernel.lines``). A broken table fails loudly as ``CONFIGURATION``, like the XID catalogue.
"""

from __future__ import annotations

import csv
import functools
from importlib import resources

from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.node_events import KernelSeverity, SxidCatalog, SxidEntry

__all__ = ["SXID_FILE", "default_sxid_catalog", "parse_sxid_catalog"]

SXID_FILE = "sxid_catalog.tsv"
_COLUMNS = ("sxid", "name", "nvidia_category", "rebound_severity", "nvidia_recovery", "source")
_CATEGORIES = frozenset({"non_fatal", "fatal", "always_fatal", "notable"})


def parse_sxid_catalog(text: str, *, origin: str = SXID_FILE) -> SxidCatalog:
    """Parse the table's TSV text (header ``sxid name nvidia_category rebound_severity nvidia_recovery source``).

    Raises:
        ReboundError: ``CONFIGURATION`` for a wrong header, a row of the wrong width, an SXid that is not a number or
            is listed twice, or an unknown category or severity.
    """
    rows = list(csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or tuple(h.strip() for h in rows[0]) != _COLUMNS:
        raise _error(origin, 1, f"header must be {' '.join(_COLUMNS)}")
    entries: list[SxidEntry] = []
    seen: set[int] = set()
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(_COLUMNS):
            raise _error(origin, lineno, f"{len(row)} fields, expected {len(_COLUMNS)}")
        sxid, name, category, severity, recovery, source = (c.strip() for c in row)
        if not sxid.isdigit() or int(sxid) in seen:
            raise _error(origin, lineno, f"sxid {sxid!r} is not a number or is listed twice")
        if category not in _CATEGORIES or severity not in set(KernelSeverity):
            raise _error(origin, lineno, f"category {category!r} or severity {severity!r} unknown")
        seen.add(int(sxid))
        entries.append(
            SxidEntry(
                sxid=int(sxid),
                name=name,
                category=category,
                severity=KernelSeverity(severity),
                recovery="" if recovery == "-" else recovery,
                source=source,
            )
        )
    return SxidCatalog(entries=tuple(entries), version=f"{origin} ({len(entries)} SXids)")


@functools.cache
def default_sxid_catalog() -> SxidCatalog:
    """The packaged table, read once per process.

    Raises:
        ReboundError: ``CONFIGURATION`` when it cannot be read or does not parse (a packaging bug).
    """
    try:
        text = resources.files("activities.kernel").joinpath(SXID_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReboundError(FailureKind.CONFIGURATION, f"SXid table {SXID_FILE}: cannot read: {exc}") from exc
    return parse_sxid_catalog(text)


def _error(origin: str, lineno: int, problem: str) -> ReboundError:
    return ReboundError(FailureKind.CONFIGURATION, f"SXid table {origin} line {lineno}: {problem}")
