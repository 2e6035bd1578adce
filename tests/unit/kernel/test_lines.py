"""The kernel-log parser on real line formats (tests/data/kernel/lines.tsv), the kmsg record format, the SXid table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from activities.kernel.lines import normalize_pci, parse_kmsg_record, parse_line
from activities.kernel.sxid_catalog import default_sxid_catalog, parse_sxid_catalog
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEventKind
from workflows.domain.node_events import KernelSeverity, NodeEventKind

DATA = Path(__file__).resolve().parents[2] / "data" / "kernel" / "lines.tsv"
ROWS = list(csv.DictReader(DATA.open(), delimiter="\t", quoting=csv.QUOTE_NONE))
SXIDS = default_sxid_catalog()


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}-{r['node_event']}" for i, r in enumerate(ROWS)])
def test_real_lines(row: dict[str, str]) -> None:
    event = parse_line(row["message"], host="n1", sxids=SXIDS)
    if row["node_event"] == "-":
        assert event is None
        return
    assert event is not None
    assert event.host == "n1" and event.source == "kernel log" and event.detail == row["message"].strip()[:300]
    assert event.node_event == NodeEventKind(row["node_event"])
    assert (event.severity.value if event.severity else "-") == row["severity"]
    assert (event.pci_bus_id or "-") == row["pci"]
    assert (str(event.sxid) if event.sxid is not None else "-") == row["sxid"]


def test_kinds_travel_as_the_agents_event_kinds() -> None:
    xid = parse_line(ROWS[0]["message"], host="n1", sxids=SXIDS)
    assert xid is not None and (xid.kind, xid.xid, xid.index) == (GpuEventKind.XID, 79, None)
    lost = parse_line("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", host="n1", sxids=SXIDS)
    assert lost is not None and lost.kind is GpuEventKind.GPU_LOST
    sx = parse_line("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 x", host="n1", sxids=SXIDS)
    assert sx is not None and (sx.kind, sx.device) == (GpuEventKind.SXID, "nvswitch0")
    aer = parse_line("pcieport 0000:00:1b.2: AER: Correctable error received from 0000:03:04.0", host="n", sxids=SXIDS)
    assert aer is not None and aer.kind is GpuEventKind.NODE


@pytest.mark.parametrize(
    ("sxid", "label", "expected"),
    [
        (24007, "Fatal", KernelSeverity.RESET),  # potentially fatal, and this time it was
        (24007, "Non-fatal", KernelSeverity.WATCH),  # potentially fatal, the driver says not this time
        (23001, "Non-fatal", KernelSeverity.DRAIN),  # always fatal whatever the label
        (11012, "Fatal", KernelSeverity.RESET),  # a correctable row the driver calls fatal: the line wins
        (11012, "Non-fatal", KernelSeverity.INFO),
        (12028, "Non-fatal", KernelSeverity.RESTART_JOB),
        (99999, "Non-fatal", KernelSeverity.WATCH),  # not in the table
    ],
)
def test_the_lines_own_label_outranks_the_tables_section(sxid: int, label: str, expected: KernelSeverity) -> None:
    line = f"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): {sxid}, {label}, Link 04 whatever"
    event = parse_line(line, host="n1", sxids=SXIDS)
    assert event is not None and event.severity is expected


def test_kmsg_records() -> None:
    raw = b"4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    rec = parse_kmsg_record(raw)
    assert rec is not None
    assert (rec.seq, rec.ts_usec, rec.priority, rec.facility) == (1234, 5678901, 4, 0)
    assert rec.message == "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    newer = parse_kmsg_record("30,7,100,c,caller=T1;systemd[1]: started\n")  # later kernels add fields
    assert newer is not None and (newer.seq, newer.facility, newer.priority, newer.message) == (
        7,
        3,
        6,
        "systemd[1]: started",
    )
    assert parse_kmsg_record(b"no header at all\n") is None
    assert parse_kmsg_record(b"a,b,c,-;message\n") is None


def test_pci_ids_compare_in_one_spelling() -> None:
    assert normalize_pci("0000:3B:00") == normalize_pci("00000000:3b:00.0") == "0000:3b:00.0"
    assert normalize_pci("00002A40:32:00.0") == "2a40:32:00.0"


def test_the_packaged_sxid_table() -> None:
    assert len(SXIDS.entries) >= 90
    assert all(e.source and e.category in {"non_fatal", "fatal", "always_fatal", "notable"} for e in SXIDS.entries)
    row = SXIDS.get(12028)
    assert row is not None and row.name == "egress nonposted PRIV error" and row.category == "non_fatal"
    always = SXIDS.get(23001)
    assert always is not None and always.severity is KernelSeverity.DRAIN
    assert SXIDS.get(1) is None


def test_a_broken_sxid_table_fails_loudly() -> None:
    header = "sxid\tname\tnvidia_category\trebound_severity\tnvidia_recovery\tsource\n"
    with pytest.raises(ReboundError) as e:
        parse_sxid_catalog(header + "12028\tx\tnon_fatal\tbogus\t-\tdoc\n")
    assert e.value.kind is FailureKind.CONFIGURATION and "line 2" in str(e.value)
    with pytest.raises(ReboundError):
        parse_sxid_catalog(header + "1\ta\tfatal\treset\t-\tdoc\n1\tb\tfatal\treset\t-\tdoc\n")
    with pytest.raises(ReboundError):
        parse_sxid_catalog("sxid\tname\n")
