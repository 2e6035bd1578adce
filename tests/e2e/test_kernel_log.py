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
