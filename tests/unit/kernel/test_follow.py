"""The agent's kernel-log follower: lines become events in the node's one stream, pinned to the right GPU."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from activities.kernel.follow import KernelLogFollower
from activities.kernel.readers import FileKernelLog, PositionStore
from activities.kernel.sxid_catalog import default_sxid_catalog
from deploy.local.fake_gpus import StateFileGpuSource
from deploy.local.fake_nvml import fake_gpu_uuid
from deploy.local.fake_nvml_state import write_initial_state
from deploy.local.kernel_log import append_kernel_line, sxid_line, xid_line
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.node_events import KernelSeverity, NodeEventKind


def _node(tmp_path: Path, host: str = "n3") -> tuple[StateFileGpuSource, Path, PositionStore]:
    state = tmp_path / f"{host}.state"
    write_initial_state(state, host, 4)
    source = StateFileGpuSource(host, state)
    source.open()
    return source, tmp_path / "kernel" / f"{host}.log", PositionStore(tmp_path / "pos" / f"{host}.json")


def _follower(source: StateFileGpuSource, log: Path, store: PositionStore) -> KernelLogFollower:
    reader = FileKernelLog(log, position=store.load())
    return KernelLogFollower(source.host, reader, source, default_sxid_catalog(), store)


def test_xid_and_sxid_lines_become_the_nodes_events(tmp_path: Path) -> None:
    source, log, store = _node(tmp_path)
    follower = _follower(source, log, store)
    append_kernel_line(log, "usb 1-1: new high-speed USB device number 2 using xhci_hcd")
    append_kernel_line(log, xid_line("n3", 2, 79))
    append_kernel_line(log, sxid_line(24007, fatal=True, text="sourcetrack timeout error"))
    added = follower.poll()
    assert [(e.kind, e.index, e.xid, e.sxid) for e in added] == [
        (GpuEventKind.XID, 2, 79, None),  # the PCI bus id in the line is GPU 2's in the NVML view
        (GpuEventKind.SXID, None, None, 24007),  # an NVSwitch: on the node, no GPU
    ]
    assert added[0].uuid == fake_gpu_uuid("n3", 2) and added[0].source == "kernel log"
    assert added[1].severity is KernelSeverity.RESET
    listed = source.events_after(0).events  # a fresh read of the agent lists them: the trust rule's confirmation
    assert [e.sequence for e in listed] == [e.sequence for e in added] and all(e.sequence for e in listed)
    assert store.load() is not None and store.load().seq == 3  # type: ignore[union-attr]


def test_a_restarted_agent_goes_on_after_its_position(tmp_path: Path) -> None:
    source, log, store = _node(tmp_path)
    append_kernel_line(log, xid_line("n3", 1, 48))
    assert len(_follower(source, log, store).poll()) == 1
    append_kernel_line(log, xid_line("n3", 3, 94))
    fresh, _, _ = _node(tmp_path / "restarted")  # a new process: a new stream, the same position file
    added = _follower(fresh, log, store).poll()
    assert [(e.index, e.xid) for e in added] == [(3, 94)]  # XID 48 is not reported twice


def test_an_xid_nvml_reported_already_is_not_added_twice(tmp_path: Path) -> None:
    source, log, store = _node(tmp_path)
    source.add_event(
        GpuEvent(kind=GpuEventKind.XID, host="n3", index=2, xid=79, source="nvml", observed_at=datetime.now(UTC))
    )
    append_kernel_line(log, xid_line("n3", 2, 79))
    append_kernel_line(log, xid_line("n3", 1, 79))  # another GPU: a fault of its own
    added = _follower(source, log, store).poll()
    assert [(e.index, e.xid) for e in added] == [(1, 79)]


def test_a_line_that_labels_an_xid_nvml_reported_is_added(tmp_path: Path) -> None:
    """NVML's event of an NVLink5 XID has no Fatal/Nonfatal label; the driver's line has one, so its copy is kept
    and the verdicts judge it in place of NVML's (``workflows/policy/xid_copies.py``)."""
    source, log, store = _node(tmp_path)
    source.add_event(
        GpuEvent(kind=GpuEventKind.XID, host="n3", index=2, xid=149, source="nvml", observed_at=datetime.now(UTC))
    )
    append_kernel_line(log, xid_line("n3", 2, 149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226)"))
    added = _follower(source, log, store).poll()
    assert [(e.index, e.xid, e.fatal) for e in added] == [(2, 149, False)]


def test_an_overrun_is_an_event(tmp_path: Path) -> None:
    source, log, store = _node(tmp_path)

    class _Overrun(FileKernelLog):
        def read(self):  # type: ignore[no-untyped-def]
            batch = super().read()
            return type(batch)(batch.records, batch.position, missed=12)

    follower = KernelLogFollower("n3", _Overrun(log), source, default_sxid_catalog(), store)
    added = follower.poll()
    assert len(added) == 1 and added[0].node_event is NodeEventKind.KMSG_OVERRUN
    assert added[0].severity is KernelSeverity.INFO and "12 kernel log records" in added[0].detail
