"""What an NVRM XID line says beyond its number: the driver's own Fatal/Nonfatal label and XID 154's new recovery
action. Pure; the job-log signatures and the kernel-log source both read lines through it, so one line means one
thing wherever it was read.

The formats, from real driver output (fixtures in ``tests/unit/policy/test_xid_line.py``):

- NVLink5 XIDs 144-150 name the failing unit, then the label, then the link (R565+)::

      NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 ...)
      NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ...)

  Drivers before R575 print ``XC 1 i 2 Link 01 [0x0000000a]``; a line may also carry ``pid=..., name=...`` before
  the unit, and some tools render the label as ``(Nonfatal)``.
- XID 154 reports the driver's recovery action changing, with NVML's number for each side::

      NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)

  The words differ between drivers ("0x2 (OS Reboot)", "0x1 (PF FLR)"); the number does not, so the number
  decides and the words are only a fallback for a line without one.
"""

from __future__ import annotations

import re

from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuRecoveryAction

__all__ = ["XidLineFacts", "xid_line_facts"]

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})?[^)]*\): (?P<xid>\d+)\b")
# The label right after the failing unit's name (pid=/name= may come first), or in parentheses anywhere.
_UNIT_LABEL = re.compile(
    r"^,?\s*(?:pid=[^,]*,\s*name=[^,]*,\s*)?(?:NVLINK:\s*)?[A-Z][A-Z0-9_]*\s+(?P<label>Fatal|Nonfatal|Non-fatal)\s"
)
_PAREN_LABEL = re.compile(r"\((?P<label>Fatal|Nonfatal|Non-fatal)\)")
_RECOVERY = re.compile(
    r"recovery action changed from (?:0x(?P<from>[0-9A-Fa-f]+)\s*)?(?:\((?P<from_name>[^)]*)\)\s*)?"
    r"to (?:0x(?P<to>[0-9A-Fa-f]+)\s*)?(?:\((?P<to_name>[^)]*)\))?",
    re.IGNORECASE,
)
# XID 154's bare form, "154, Node Reboot Required", and the words for a side printed without its number.
_ACTION_WORDS: tuple[tuple[str, GpuRecoveryAction], ...] = (
    ("none", GpuRecoveryAction.NONE),
    ("gpu reset", GpuRecoveryAction.GPU_RESET),
    ("pf flr", GpuRecoveryAction.GPU_RESET),
    ("node reboot", GpuRecoveryAction.NODE_REBOOT),
    ("os reboot", GpuRecoveryAction.NODE_REBOOT),
    ("drain p2p", GpuRecoveryAction.DRAIN_P2P),
    ("drain and reset", GpuRecoveryAction.DRAIN_AND_RESET),
)


class XidLineFacts(Frozen):
    """One XID line's fields; None where the line does not say."""

    xid: int
    pci_bus_id: str = ""
    """As printed (``0018:01:00``), without the ``PCI:`` prefix."""
    fatal: bool | None = None
    """The driver's own label: True for ``Fatal``, False for ``Nonfatal``."""
    recovery_from: GpuRecoveryAction | None = None
    recovery_to: GpuRecoveryAction | None = None
    """XID 154: the action the driver asks for now (``NONE``: the earlier one is no longer needed)."""


def xid_line_facts(line: str) -> XidLineFacts | None:
    """The facts of the NVRM XID line in ``line`` (kernel timestamps or a log prefix before it are fine), or None
    when ``line`` holds no XID line."""
    m = _XID.search(line)
    if m is None:
        return None
    xid = int(m["xid"])
    rest = line[m.end() :]
    label = _UNIT_LABEL.search(rest) or _PAREN_LABEL.search(rest)
    fatal = None if label is None else label["label"] == "Fatal"
    before = after = None
    if xid == 154:
        before, after = _recovery(rest)
    return XidLineFacts(xid=xid, pci_bus_id=m["pci"] or "", fatal=fatal, recovery_from=before, recovery_to=after)


def _recovery(rest: str) -> tuple[GpuRecoveryAction | None, GpuRecoveryAction | None]:
    m = _RECOVERY.search(rest)
    if m is None:
        return None, _words(rest)  # "154, Node Reboot Required": the new action alone
    before = _side(m["from"], m["from_name"])
    after = _side(m["to"], m["to_name"])
    return before, after


def _side(code: str | None, name: str | None) -> GpuRecoveryAction | None:
    if code is not None:
        return GpuRecoveryAction.from_code(int(code, 16))
    return _words(name) if name else None


def _words(text: str) -> GpuRecoveryAction | None:
    low = text.lower()
    # Longest phrase first: "drain and reset" must not be read as a plain reset.
    for words, action in sorted(_ACTION_WORDS, key=lambda wa: -len(wa[0])):
        if re.search(rf"\b{re.escape(words)}\b", low):
            return action
    return None
