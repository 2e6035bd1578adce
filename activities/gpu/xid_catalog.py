"""NVIDIA's XID catalogue, loaded from the packaged TSV into an ``XidCatalog`` model.

The table (``activities/logs/xid_catalog.tsv``, a copy of ``shared/data/xid_catalog.tsv`` that the log
signatures read too: one copy in the package, not two) is NVIDIA's XID catalogue with its
"resolution bucket" per XID, joined with NVSentinel's mapping; its ``source`` column says where each row came
from. Policy never reads files (``workflows/policy/gpu_event_rules.py`` takes the catalogue as data), so this loader
is the one place that does, at worker start. A broken table is a packaging bug: it fails loudly as
``CONFIGURATION`` with the line at fault rather than leaving every XID "unknown".
"""

from __future__ import annotations

import csv
import functools
from importlib import resources
from pathlib import Path

from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import XidCatalog, XidCatalogEntry

__all__ = ["CATALOG_FILE", "CATALOG_PACKAGE", "default_xid_catalog", "load_xid_catalog", "parse_xid_catalog"]

CATALOG_PACKAGE = "activities.logs"
CATALOG_FILE = "xid_catalog.tsv"
_REQUIRED = ("xid", "mnemonic", "name_meaning", "nvidia_immediate_action")


def parse_xid_catalog(text: str, *, origin: str = CATALOG_FILE) -> XidCatalog:
    """Parse the catalogue's TSV text.

    Args:
        text: Tab-separated, one header line naming at least ``xid``, ``mnemonic``, ``name_meaning`` and
            ``nvidia_immediate_action``; further known columns are used when present, unknown ones ignored.
        origin: Named in errors and in the catalogue's ``version``.

    Returns:
        The catalogue, entries in file order.

    Raises:
        ReboundError: ``CONFIGURATION`` for a missing column, a row with the wrong number of fields, an XID that
            is not a non-negative integer, or an XID listed twice.
    """
    rows = list(csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise _error(origin, 1, "empty file: expected a header line")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise _error(origin, 1, f"header lacks column(s) {', '.join(missing)}")
    col = {name: i for i, name in enumerate(header)}
    entries: list[XidCatalogEntry] = []
    seen: set[int] = set()
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise _error(origin, lineno, f"{len(row)} fields, the header has {len(header)}")
        raw = row[col["xid"]].strip()
        if not raw.isdigit():
            raise _error(origin, lineno, f"xid {raw!r} is not a non-negative integer")
        xid = int(raw)
        if xid in seen:
            raise _error(origin, lineno, f"xid {xid} is listed twice")
        seen.add(xid)
        cells = {name: row[i].strip() for name, i in col.items()}
        entries.append(
            XidCatalogEntry(
                xid=xid,
                mnemonic=cells["mnemonic"],
                meaning=cells["name_meaning"],
                action=cells["nvidia_immediate_action"] or "-",
                nvsentinel_action=cells.get("nvsentinel_action") or "-",
                severity=cells.get("nvsentinel_severity") or "-",
                recommended_action=cells.get("recommended_action", ""),
            )
        )
    return XidCatalog(entries=tuple(entries), version=f"{origin} ({len(entries)} XIDs)")


def load_xid_catalog(path: Path | None = None) -> XidCatalog:
    """Read the catalogue from ``path``, or the copy packaged with Rebound when ``path`` is None.

    Raises:
        ReboundError: ``CONFIGURATION`` when the file cannot be read or does not parse (see ``parse_xid_catalog``).
    """
    try:
        if path is None:
            text = resources.files(CATALOG_PACKAGE).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
            origin = CATALOG_FILE
        else:
            text = path.read_text(encoding="utf-8")
            origin = str(path)
    except (OSError, UnicodeDecodeError) as exc:
        where = str(path) if path is not None else f"packaged {CATALOG_FILE}"
        raise ReboundError(FailureKind.CONFIGURATION, f"XID catalogue {where}: cannot read: {exc}") from exc
    return parse_xid_catalog(text, origin=origin)


@functools.cache
def default_xid_catalog() -> XidCatalog:
    """The packaged catalogue, read once per process (it is immutable)."""
    return load_xid_catalog()


def _error(origin: str, lineno: int, problem: str) -> ReboundError:
    return ReboundError(FailureKind.CONFIGURATION, f"XID catalogue {origin} line {lineno}: {problem}")
