"""Attribution weighs GPU faults, not GPU evidence: an NVLink5 XID the driver labels Nonfatal, XID 154 back to None
or an informational XID on a job node does not make a rank's crash a hardware failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.logs.attribution import gpu_faults_since
from tests.unit.policy.test_xid_line import FATAL_149, NONFATAL_149, XID154_BACK_TO_NONE
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import FailureClass
from workflows.policy.attribution import AttributionFacts, attribute
from workflows.policy.xid_line import xid_line_facts

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)


def _event(line: str, at: datetime = T0) -> GpuEvent:
    facts = xid_line_facts(line)
    assert facts is not None
    return GpuEvent(
        kind=GpuEventKind.XID,
        host="n2",
        index=1,
        xid=facts.xid,
        fatal=facts.fatal,
        recovery_action=facts.recovery_to,
        source="kmsg",
        observed_at=at,
    )


def test_only_recent_faults_count() -> None:
    informational = GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=43, observed_at=T0)
    old_fault = _event(FATAL_149, T0 - timedelta(hours=1))
    events = [_event(NONFATAL_149), _event(XID154_BACK_TO_NONE), informational, old_fault, _event(FATAL_149)]
    kept = gpu_faults_since(events, T0 - timedelta(minutes=5))
    assert [(e.xid, e.fatal) for e in kept] == [(149, True)]


def test_a_nonfatal_nvlink_xid_does_not_make_the_failure_hardware() -> None:
    evidence = gpu_faults_since([_event(NONFATAL_149), _event(XID154_BACK_TO_NONE)], T0 - timedelta(minutes=5))
    verdict = attribute(AttributionFacts.from_findings(("n1", "n2"), [], gpu_events=evidence))
    assert verdict.failure_class is not FailureClass.HARDWARE
    fatal = gpu_faults_since([_event(FATAL_149)], T0 - timedelta(minutes=5))
    verdict = attribute(AttributionFacts.from_findings(("n1", "n2"), [], gpu_events=fatal))
    assert (verdict.failure_class, verdict.cause) == (FailureClass.HARDWARE, "xid-149")
    assert verdict.implicated_nodes == ("n2",)
