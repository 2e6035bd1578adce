"""Kernel-log node events in policy: severity -> status and action, what may interrupt a job, the node verdict."""

from __future__ import annotations

import pytest

from activities.gpu.xid_catalog import default_xid_catalog
from workers.gpu_push import node_level_fault
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind, GpuHealthReport, GpuHealthStatus, GpuSample
from workflows.domain.node_events import KernelSeverity, NodeEventKind
from workflows.policy.attribution_facts import AttributionFacts
from workflows.policy.attribution_gpu import gpu_attribution
from workflows.policy.fleet.late_fault import _fault_words
from workflows.policy.gpu_event_rules import event_findings, is_gpu_fault
from workflows.policy.gpu_health import verdict_for_report
from workflows.policy.node_events import is_actionable, kernel_verdict

CATALOG = default_xid_catalog()


def _node(kind: NodeEventKind, severity: KernelSeverity, **fields: object) -> GpuEvent:
    event_kind = GpuEventKind.SXID if kind is NodeEventKind.SXID else GpuEventKind.NODE
    return GpuEvent.model_validate(
        {"kind": event_kind, "host": "n2", "source": "kernel log", "node_event": kind, "severity": severity, **fields}
    )


@pytest.mark.parametrize(
    ("severity", "status", "action", "actionable"),
    [
        (KernelSeverity.INFO, GpuHealthStatus.HEALTHY, GpuAction.NONE, False),
        (KernelSeverity.WATCH, GpuHealthStatus.DEGRADED, GpuAction.WATCH, False),
        (KernelSeverity.RESTART_JOB, GpuHealthStatus.DEGRADED, GpuAction.RESTART_JOB, True),
        (KernelSeverity.RESET, GpuHealthStatus.FAILED, GpuAction.RESET_GPU, True),
        (KernelSeverity.DRAIN, GpuHealthStatus.FAILED, GpuAction.DRAIN_NODE, True),
    ],
)
def test_severity_to_action(
    severity: KernelSeverity, status: GpuHealthStatus, action: GpuAction, actionable: bool
) -> None:
    event = _node(NodeEventKind.PCIE_AER, severity, device="0000:3b:00.0", detail="pcieport ...: AER: ...")
    got_status, got_action, text = kernel_verdict(event)
    assert (got_status, got_action) == (status, action)
    assert "PCIe AER error on 0000:3b:00.0" in text and severity.value in text
    assert is_actionable(event) is actionable
    assert is_gpu_fault(event, CATALOG) is actionable


def test_nvml_events_are_always_actionable_and_judged_by_the_xid_catalogue() -> None:
    xid = GpuEvent(kind=GpuEventKind.XID, host="n2", index=0, xid=79, source="kernel log")
    assert is_actionable(xid)
    assert event_findings(xid, CATALOG, pinned=True)[0].action is GpuAction.DRAIN_NODE


def test_a_fatal_sxid_is_node_level_evidence_for_the_fleet() -> None:
    sxid = _node(NodeEventKind.SXID, KernelSeverity.RESET, sxid=24007, pci_bus_id="0000:c3:00.0", device="nvswitch0")
    fault = node_level_fault(sxid, "n2", CATALOG)
    assert fault is not None and fault.action is GpuAction.RESET_GPU and "NVSwitch SXid 24007" in fault.finding
    assert _fault_words(sxid) == "sxid-24007"
    assert _fault_words(_node(NodeEventKind.FS_READONLY, KernelSeverity.DRAIN)) == "fs_readonly"
    watched = _node(NodeEventKind.SXID, KernelSeverity.WATCH, sxid=20009)
    assert node_level_fault(watched, "n2", CATALOG) is None  # the job's (or nobody's) to handle


def test_the_node_verdict_counts_kernel_events_on_the_node() -> None:
    samples = (GpuSample(host="n2", index=0, temperature_c=40),)
    events = (
        _node(NodeEventKind.SXID, KernelSeverity.RESET, sxid=24007),
        _node(NodeEventKind.PCIE_AER, KernelSeverity.INFO),  # informational: no finding
        _node(NodeEventKind.NFS_NOT_RESPONDING, KernelSeverity.WATCH, device="home01"),
    )
    verdict = verdict_for_report(GpuHealthReport(host="n2", samples=samples, events=events), catalog=CATALOG)
    assert verdict.status is GpuHealthStatus.FAILED and verdict.action is GpuAction.RESET_GPU
    rules = sorted(f.rule for f in verdict.findings)
    assert rules == ["kernel_nfs_not_responding", "sxid"]


def test_attribution_names_the_kernel_event_and_ignores_what_is_only_watched() -> None:
    fatal = _node(
        NodeEventKind.SXID, KernelSeverity.RESET, sxid=24007, device="nvswitch0", detail="nvidia-nvswitch0: SXid ..."
    )
    watched = _node(NodeEventKind.NFS_NOT_RESPONDING, KernelSeverity.WATCH, device="home01")
    facts = AttributionFacts(job_nodes=("n2", "n3"), rank_nodes={0: "n2"}, gpu_events=(watched, fatal))
    got = gpu_attribution(facts)
    assert got is not None and got.cause == "sxid-24007" and got.implicated_nodes == ("n2",)
    assert "sxid-24007 on n2 (nvswitch0)" in got.explanation and "sxid=24007" in got.evidence[0].text
    only_watched = AttributionFacts(job_nodes=("n2",), rank_nodes={0: "n2"}, gpu_events=(watched,))
    assert gpu_attribution(only_watched) is None
    aer = _node(NodeEventKind.PCIE_AER, KernelSeverity.DRAIN, device="0000:3b:00.0")
    aer_facts = AttributionFacts(job_nodes=("n2",), rank_nodes={0: "n2"}, gpu_events=(aer,))
    got_aer = gpu_attribution(aer_facts)
    assert got_aer is not None and got_aer.cause == "pcie-aer"
