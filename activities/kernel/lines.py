"""Kernel log lines into typed node events. Pure: no I/O; the SXid table comes in as data.

Two layers: ``parse_kmsg_record`` reads ``/dev/kmsg``'s record format (``pri,seq,ts_usec,flags[,...];message`` and
continuation lines ``" KEY=value"``, Documentation/ABI/testing/dev-kmsg), and ``parse_line`` turns one message into
a ``GpuEvent`` (the agent's event type: ADR 008) or None for a line that reports nothing. The XID and "fallen off
the bus" patterns are the job-log signature table's own rows (``activities/logs/signature_table.py``: one
definition of an NVRM line); the rest are written against real kernel lines (``tests/data/kernel``).

What each kind's severity is, as read from the line:
- NVSwitch SXid: NVIDIA's row (``sxid_catalog.tsv``); the line's own ``Fatal``/``Non-fatal`` outranks the row's
  section (NVIDIA prints it per occurrence: a potentially fatal SXid that was not, says so);
- PCIe AER: ``Corrected`` INFO, ``Uncorrected (Non-Fatal)`` RESTART_JOB, ``Uncorrected (Fatal)`` DRAIN;
- mlx5: a module or cable error, a firmware fatal/health error DRAIN; a port going down WATCH; notices (plugged,
  link up) nothing;
- machine check: "events logged" (corrected, CMCI) INFO; an uncorrected error or an exception DRAIN;
- hung task, soft lockup, NFS, Lustre: WATCH (symptoms: the server or the workload may be at fault, not the node);
- a file system remounted read-only DRAIN; a fabric manager failure RESET.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from activities.logs.signature_types import PCI_ID
from activities.logs.signatures import SIGNATURES
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.node_events import KernelRecord, KernelSeverity, NodeEventKind, SxidCatalog
from workflows.policy.xid_copies import KERNEL_LOG_SOURCE
from workflows.policy.xid_line import xid_line_facts

__all__ = ["SOURCE", "normalize_pci", "parse_kmsg_record", "parse_line"]

SOURCE = KERNEL_LOG_SOURCE
_DETAIL_MAX = 300
_S = KernelSeverity
_K = NodeEventKind


def _pattern(signature_id: str) -> re.Pattern[str]:
    for sig in SIGNATURES:
        if sig.id == signature_id:
            return sig.pattern
    raise LookupError(f"signature row {signature_id} is gone from activities/logs/signature_table.py")


_XID = _pattern("nvrm_xid")
_FELL_OFF = re.compile(rf"NVRM: GPU (?:at PCI:)?(?P<gpu>{PCI_ID}): GPU has fallen off the bus")
_SXID = re.compile(
    rf"nvidia-nvswitch(?P<switch>\d+): SXid \(PCI:(?P<pci>{PCI_ID})\): (?P<sxid>\d+),\s*(?P<fatal>Non-fatal|Fatal)?"
    r"(?:,\s*)?(?P<rest>.*)"
)
# Fabric Manager's own report of an NVSwitch error (its log, or the journal): "detected NVSwitch non-fatal error
# 12028 on fid 0 on NVSwitch pci bus id 00000000:05:00.0 physical id 3 port 32".
_FM_SXID = re.compile(
    r"detected NVSwitch (?P<fatal>non-fatal|fatal) error (?P<sxid>\d+) .*?pci bus id (?P<pci>[0-9A-Fa-f:.]+)"
)
_FM_FAILED = re.compile(r"(?i)\b(?:nvidia-)?fabric ?manager\b.*\b(?:failed|error|not running|timed out)\b")
_AER = re.compile(
    rf"(?P<dev>{PCI_ID}): (?:AER: )?(?:Multiple )?(?P<sev>Corrected|Correctable|Uncorrected \(Non-Fatal\)"
    r"|Uncorrectable \(Non-Fatal\)|Uncorrected \(Fatal\)|Uncorrectable \(Fatal\)) error(?: message)? received"
    rf"(?: from|:(?: id=\w+)?)?\s*(?P<src>{PCI_ID})?"
)
_MLX5 = re.compile(rf"(?:mlx5_core|mlx5_ib\w*) (?P<pci>{PCI_ID})(?: (?P<netdev>\S+?))?: (?P<what>.*)$")
_MLX5_BAD = re.compile(
    r"(?i)Port module event\[error\]|\bcable error\b|fw_fatal|\bfatal error\b|health compromised|"
    r"\bin error state\b|internal error|catastrophic|unrecoverable|\bhealth poll failed\b|\bsyndrome\b.*\bcrdump\b"
)
_MLX5_DOWN = re.compile(r"(?i)\bLink down\b|\bport \d+ .*state .*\bdown\b")
_MCE = re.compile(r"mce: \[Hardware Error\]: (?P<what>.*)|mce: (?P<uc>Uncorrected hardware memory error.*)")
_MCE_FATAL = re.compile(r"(?i)uncorrected|machine check exception|\bPANIC\b|fatal")
_HUNG = re.compile(r"INFO: task (?P<task>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds")
_SOFT = re.compile(
    r"(?:watchdog: )?BUG: soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s!(?: \[(?P<task>[^\]]*)\])?"
)
_RO = re.compile(
    r"(?P<fs>EXT[234]-fs|XFS|BTRFS(?: \w+)?) \((?P<dev>[^)]+)\): .*?(?:Remounting filesystem read-only"
    r"|remounting filesystem read-only|forced to read-only|Shutting down filesystem|shut ?down)"
)
_NFS = re.compile(r"nfs: server (?P<server>\S+) not responding(?P<how>, still trying|, timed out)?")
_LUSTRE = re.compile(r"Lustre: (?P<client>\S+): Connection to (?P<target>\S+) \(at (?P<nid>[^)]+)\) was lost")


def normalize_pci(bus_id: str) -> str:
    """``0000:3b:00``, ``00000000:3B:00.0`` -> ``0000:3b:00.0``: one spelling to compare NVML's and the kernel's."""
    head, _, fn = bus_id.strip().lower().partition(".")
    parts = head.split(":")
    if len(parts) == 3:
        domain, bus, dev = parts
        return f"{int(domain, 16):04x}:{bus}:{dev}.{fn or '0'}"
    return bus_id.strip().lower()


def parse_kmsg_record(raw: bytes | str) -> KernelRecord | None:
    """One ``/dev/kmsg`` record (what one ``read(2)`` returns), or None for bytes that are not one.

    The prefix is ``pri,seq,ts_usec,flags`` (newer kernels may add fields after a comma); the message runs to the
    first newline, with ``\\xNN`` escapes for unprintable bytes left as the kernel wrote them; continuation lines
    (" SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0") are dropped.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    head, sep, rest = text.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4 or not all(f.isdigit() for f in fields[:3]):
        return None
    pri, seq, ts = (int(f) for f in fields[:3])
    message = rest.split("\n", 1)[0]
    return KernelRecord(seq=seq, message=message, priority=pri & 7, facility=pri >> 3, ts_usec=ts)


def parse_line(  # noqa: PLR0911, PLR0912 (one branch per kind of line)
    message: str, *, host: str, sxids: SxidCatalog, observed_at: datetime | None = None
) -> GpuEvent | None:
    """The node event ``message`` reports, or None for a line that reports none (most lines).

    The GPU index is not known here (the line names a PCI bus id): the agent fills it in from its NVML view.
    """
    detail = message.strip()[:_DETAIL_MAX]
    event = _Maker(host, detail, observed_at)

    if "NVRM" in message:
        if m := _XID.search(message):
            # The catalogue judges an XID (the same as NVML's event), and the line's own words outrank it where it
            # has any: NVLink5's Fatal/Nonfatal label, XID 154's new recovery action (workflows/policy/xid_line.py).
            pci = normalize_pci(m.group("gpu")) if m.group("gpu") else ""
            said = xid_line_facts(message)
            return GpuEvent(
                kind=GpuEventKind.XID,
                host=host,
                xid=int(m.group("xid")),
                pci_bus_id=pci,
                source=SOURCE,
                observed_at=observed_at,
                node_event=_K.XID,
                detail=detail,
                fatal=said.fatal if said is not None else None,
                recovery_action=said.recovery_to if said is not None else None,
            )
        if m := _FELL_OFF.search(message):
            return event(GpuEventKind.GPU_LOST, _K.GPU_FALLEN_OFF_BUS, _S.DRAIN, pci_bus_id=normalize_pci(m["gpu"]))
        return None
    if "SXid" in message and (m := _SXID.search(message)):
        return _sxid_event(event, int(m["sxid"]), m["pci"], m["fatal"], sxids, device=f"nvswitch{m['switch']}")
    if "NVSwitch" in message and (m := _FM_SXID.search(message)):
        return _sxid_event(event, int(m["sxid"]), m["pci"], m["fatal"], sxids, device="fabric manager")
    if _FM_FAILED.search(message):
        return event(GpuEventKind.NODE, _K.FABRIC_MANAGER, _S.RESET, device="nvidia-fabricmanager")
    if "rror" in message and (m := _AER.search(message)):
        sev = m["sev"]
        severity = _S.INFO if sev.startswith("Correct") else _S.DRAIN if "(Fatal)" in sev else _S.RESTART_JOB
        device = normalize_pci(m["src"] or m["dev"])
        return event(GpuEventKind.NODE, _K.PCIE_AER, severity, pci_bus_id=device, device=device)
    if "mlx5" in message and (m := _MLX5.search(message)):
        what = m["what"]
        nic = normalize_pci(m["pci"]) + (f" {m['netdev']}" if m["netdev"] else "")
        if _MLX5_BAD.search(what):
            return event(GpuEventKind.NODE, _K.IB_PORT, _S.DRAIN, pci_bus_id=normalize_pci(m["pci"]), device=nic)
        if _MLX5_DOWN.search(what):
            return event(GpuEventKind.NODE, _K.IB_PORT, _S.WATCH, pci_bus_id=normalize_pci(m["pci"]), device=nic)
        return None  # "Port module event: module 0, Cable plugged", "Link up", firmware versions: notices
    if "mce" in message and (m := _MCE.search(message)):
        what = m["what"] or m["uc"] or ""
        if m["uc"] or _MCE_FATAL.search(what):
            return event(GpuEventKind.NODE, _K.MCE, _S.DRAIN)
        if "events logged" in what:
            return event(GpuEventKind.NODE, _K.MCE, _S.INFO)
        return None  # the report's detail lines ("Run the above through 'mcelog --ascii'", "TSC ...")
    if m := _HUNG.search(message):
        return event(GpuEventKind.NODE, _K.HUNG_TASK, _S.WATCH, device=f"{m['task']}:{m['pid']}")
    if m := _SOFT.search(message):
        return event(GpuEventKind.NODE, _K.SOFT_LOCKUP, _S.WATCH, device=f"CPU#{m['cpu']}")
    if m := _RO.search(message):
        return event(GpuEventKind.NODE, _K.FS_READONLY, _S.DRAIN, device=m["dev"])
    if m := _NFS.search(message):
        return event(GpuEventKind.NODE, _K.NFS_NOT_RESPONDING, _S.WATCH, device=m["server"])
    if m := _LUSTRE.search(message):
        return event(GpuEventKind.NODE, _K.LUSTRE_CONNECTION_LOST, _S.WATCH, device=f"{m['target']} ({m['nid']})")
    return None


@dataclass(frozen=True, slots=True)
class _Maker:
    """Builds one line's event: what every kind shares (host, source, time, the line) filled in once."""

    host: str
    detail: str
    observed_at: datetime | None

    def __call__(
        self, kind: GpuEventKind, node_event: NodeEventKind, severity: KernelSeverity, **fields: object
    ) -> GpuEvent:
        return GpuEvent.model_validate(
            {
                "kind": kind,
                "host": self.host,
                "source": SOURCE,
                "observed_at": self.observed_at,
                "node_event": node_event,
                "severity": severity,
                "detail": self.detail,
                **fields,
            }
        )


def _sxid_event(event: _Maker, sxid: int, pci: str, fatal: str | None, sxids: SxidCatalog, *, device: str) -> GpuEvent:
    """An SXid's event: NVIDIA's row, the line's own Fatal/Non-fatal first."""
    entry = sxids.get(sxid)
    row_severity = entry.severity if entry is not None else _S.WATCH
    label = (fatal or "").lower()
    if label == "fatal":
        severity = max(row_severity, _S.RESET, key=_rank)
    elif label == "non-fatal" and entry is not None and entry.category == "fatal":
        # A potentially fatal SXid the driver reports as non-fatal this time: watched, not acted on.
        severity = _S.WATCH
    else:
        severity = row_severity
    return event(GpuEventKind.SXID, _K.SXID, severity, sxid=sxid, pci_bus_id=normalize_pci(pci), device=device)


def _rank(severity: KernelSeverity) -> int:
    return list(KernelSeverity).index(severity)
