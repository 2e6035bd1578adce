"""End to end: an XID and an NVSwitch SXid written to a lab node's kernel log reach Rebound through the node's own
agent, pinned to the right GPU and node (issue 14).

The lab's nodes share one kernel, so each node's agent follows a file-backed kernel log ($STATE/kernel/<node>.log,
``rebound lab inject kernel``); the agent maps the XID line's PCI bus id to the GPU index through its NVML view (the
fake NVML's bus ids), and lists both events in a fresh read: the read the trust rule asks for before a claim counts.
"""

from __future__ import annotations

import asyncio
import time

from activities.gpu.xid_catalog import default_xid_catalog
from deploy.local.fake_nvml import fake_gpu_uuid
from deploy.local.fake_nvml_state import append_xid
from deploy.local.kernel_log import append_kernel_line, sxid_line, xid_line
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.nodes_cli import read_node_gpus
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind, GpuHealthStatus
from workflows.domain.node_events import KernelSeverity, NodeEventKind
from workflows.policy.gpu_health import verdict_for_report

NODE = "n4"


async def test_xid_and_sxid_in_the_kernel_log_are_attributed_to_gpu_and_node(lab: LabHandle) -> None:
    started = time.monotonic()
    settings = lab_rebound_settings(lab)
    before = await read_node_gpus(settings, NODE)
    assert before.agent_reachable and before.report is not None, before.error
    cursor = before.report.next_event_cursor

    log = lab.layout.kernel_log(NODE)
    append_kernel_line(log, "usb 1-1: new high-speed USB device number 2 using xhci_hcd")  # a line that says nothing
    append_kernel_line(log, xid_line(NODE, 2, 79))
    append_kernel_line(log, sxid_line(24007, fatal=True, text="sourcetrack timeout error"))

    deadline = time.monotonic() + 15
    seen: list[GpuEvent] = []
    last = before.report
    while time.monotonic() < deadline and len(seen) < 2:
        res = await read_node_gpus(settings, NODE)
        assert res.report is not None
        last = res.report
        seen += [e for e in res.report.events if e.sequence > cursor and e.source == "kernel log"]
        cursor = max(cursor, res.report.next_event_cursor)
        if len(seen) < 2:
            await asyncio.sleep(0.1)
    assert len(seen) == 2, f"kernel-log events seen: {seen}"
    xid, sxid = seen
    assert (xid.kind, xid.host, xid.index, xid.xid) == (GpuEventKind.XID, NODE, 2, 79)
    assert xid.uuid == fake_gpu_uuid(NODE, 2)  # the PCI bus id in the line is GPU 2's in the node's NVML view
    assert (sxid.kind, sxid.host, sxid.index, sxid.sxid) == (GpuEventKind.SXID, NODE, None, 24007)
    assert sxid.node_event is NodeEventKind.SXID and sxid.severity is KernelSeverity.RESET

    # The node's verdict from that read: GPU 2 failed by the XID, the node by the fatal SXid.
    report = last.model_copy(update={"events": tuple(seen)})
    verdict = verdict_for_report(report, catalog=default_xid_catalog())
    assert verdict.status is GpuHealthStatus.FAILED and verdict.action is GpuAction.DRAIN_NODE
    gpu2 = next(g for g in verdict.gpus if g.index == 2)
    assert gpu2.status is GpuHealthStatus.FAILED and any(f.xid == 79 for f in gpu2.findings)
    assert any(f.rule == "sxid" and f.action is GpuAction.RESET_GPU for f in verdict.findings)
    print(f"\nkernel-log XID + SXid seen through {NODE}'s agent in {time.monotonic() - started:.2f} s")


async def test_a_nonfatal_nvlink_xid_read_through_nvml_is_judged_by_its_line(lab: LabHandle) -> None:
    """NVML's event of an NVLink5 XID has no label (the catalogue would call it fatal); the driver's kernel line says
    Nonfatal. The agent lists both copies, the verdict of its read is healthy, and its push loop pushes neither."""
    settings = lab_rebound_settings(lab)
    before = await read_node_gpus(settings, NODE)
    assert before.report is not None, before.error
    cursor = before.report.next_event_cursor
    agent_log = next(lab.layout.log_file(s) for s, nodes in lab.cfg.agent_groups() if NODE in nodes)
    log_size = agent_log.stat().st_size

    append_xid(lab.layout.nvml_state(NODE), 1, 149)  # what NVML's event API delivers: the number only
    append_kernel_line(
        lab.layout.kernel_log(NODE), xid_line(NODE, 1, 149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226)")
    )
    deadline = time.monotonic() + 15
    seen: list[GpuEvent] = []
    while time.monotonic() < deadline and len(seen) < 2:
        res = await read_node_gpus(settings, NODE)
        assert res.report is not None
        seen += [e for e in res.report.events if e.sequence > cursor and e.xid == 149]
        cursor = max(cursor, res.report.next_event_cursor)
        await asyncio.sleep(0.1)
    assert sorted((e.source, e.fatal) for e in seen) == [("kernel log", False), ("nvml", None)], seen

    verdict = verdict_for_report(
        before.report.model_copy(update={"events": tuple(seen)}), catalog=default_xid_catalog()
    )
    gpu1 = next(g for g in verdict.gpus if g.index == 1)
    assert gpu1.status is GpuHealthStatus.HEALTHY, gpu1.reasons

    # The push loop's decision, from the agent's own log: NVML's copy held for its line, then dropped.
    deadline = time.monotonic() + 10
    said = ""
    while time.monotonic() < deadline and "not pushing NVML's XID 149 on GPU 1" not in said:
        await asyncio.sleep(0.2)
        with agent_log.open("rb") as f:
            f.seek(log_size)
            said = f.read().decode(errors="replace")
    assert "not pushing NVML's XID 149 on GPU 1" in said, said[-2000:]
    assert "reported xid" not in said.lower()
