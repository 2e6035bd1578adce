"""Reading ``unmunge``'s output: the metadata block, a blank line, then the payload. Pure."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from workflows.domain.base import Frozen

__all__ = ["UnmungeResult", "parse_unmunge"]

_FIELD = re.compile(r"^([A-Z_]+):\s*(.*)$")
_NUMBER_IN_PARENS = re.compile(r"\((-?\d+)\)\s*$")


class UnmungeResult(Frozen):
    status: str
    """``Success``, ``Replayed credential``, ``Expired credential``, ...: only ``Success`` verifies."""
    status_code: int
    uid: int | None = None
    user: str = ""
    """The user name as the *decoding* host printed it (the UID is what counts)."""
    gid: int | None = None
    encoded_at: datetime | None = None
    payload: str = ""

    @property
    def success(self) -> bool:
        return self.status_code == 0 and self.status == "Success"


def _number(value: str) -> int | None:
    m = _NUMBER_IN_PARENS.search(value)
    return int(m.group(1)) if m else None


def parse_unmunge(stdout: str) -> UnmungeResult:
    """The fields Rebound reads from ``unmunge``'s standard output; ValueError when it is not that output.

    A replayed or expired credential still prints its UID and payload: the status decides, not their presence.
    """
    head, sep, payload = stdout.partition("\n\n")
    fields: dict[str, str] = {}
    for line in head.splitlines():
        m = _FIELD.match(line.strip())
        if m:
            fields[m.group(1)] = m.group(2).strip()
    status = fields.get("STATUS")
    if status is None:
        raise ValueError("unmunge printed no STATUS line")
    code = _number(status)
    if code is None:
        raise ValueError(f"unmunge's STATUS has no code: {status!r}")
    text = status[: status.rfind("(")].strip()
    uid_field = fields.get("UID", "")
    epoch = _number(fields.get("ENCODE_TIME", ""))
    return UnmungeResult(
        status=text,
        status_code=code,
        uid=_number(uid_field),
        user=uid_field.split(" (", 1)[0].strip(),
        gid=_number(fields.get("GID", "")),
        encoded_at=datetime.fromtimestamp(epoch, UTC) if epoch is not None else None,
        payload=payload if sep else "",
    )
