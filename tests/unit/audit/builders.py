"""Hand-built JobRecovery statuses with known incidents, Fleet approvals, and the audit numbers they must give (pure).

Three jobs over a 10 h period (``SINCE`` .. ``UNTIL``); times are offsets in seconds from ``SINCE``:

- job 101 (runs through the whole period): four incidents.
  1. rank crash at 3600, evidence at 3598 (detection 2 s); xid-79 on n1, drain n1, requeue verified at 3630
     (action 30 s), resumed at 3900 (resume 300 s). Down 300 s.
  2. GPU fault at 10800, GPU event at 10790 (detection 10 s); xid-79 on n2, drain n2, requeue verified at 10860
     (60 s); failed again, never resumed: down until incident 3 (600 s).
  3. rank crash at 11400, no timestamped evidence (detection unknown); node-down on n3, requeue only, verified at
     11420 (20 s), resumed at 12000 (600 s). Down 600 s.
  4. straggler at 18000 on n1, reported only: no downtime, no latencies.
  Downtime 1500 s of 36000 s.
- job 202 (runs 7200 .. 21600, then gave up): a hang at 14400, silent for 90 s (detection 90 s), user-bug, not
  retryable, no action, never resumed. Down 7200 s of 14400 s: goodput 0.5.
- job 303 (from before the period to after it): a node failure detected 600 s *before* the period, resumed 600 s
  into it. Not an incident of the period, but 600 s of downtime in it.

The Fleet's approvals (``fleet_approvals``), as the Fleet holds them when the audit reads it:

  a-1  drain n9 (job 99)      requested -3000, approved by bob at -2000    before the period: left out
  a-8  drain n8 (job 404)     requested -7200, never answered              waited all period: pending at the end
  a-4  restart (job 202)      requested -600, rejected by bob at 300       decided in the period: waited 900 s
  a-2  drain n1 (101-1)       requested 3601, approved by alice at 3621    waited 20 s
  a-3  drain n2 (101-2)       requested 10810, never answered              pending at the end
  a-9  drain n3 (101-3)       requested 12000, approved by carol at 12060  waited 60 s
  a-5  drain n5 (job 303)     requested 20000, expired at 20900 (rejected) waited 900 s, decided by nobody
  a-6  restart (job 101)      requested 35000, approved by alice at 36600  decided after the period: pending at end
  a-7  drain n7 (job 101)     requested 36500                              after the period: left out

Of the period: 7 (drain 5: 2 approved, 1 expired, 2 pending; restart 2: 1 rejected, 1 pending), 3 pending at
the end; waits 20, 60, 900, 900 s: p50 480 s, max 900 s; decided by alice, bob, carol, nobody (expired): 1 each.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.domain.fleet import Approval, ApprovalKind, ApprovalOutcome, IsolationRequest
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.hang import HangVerdict, WindowBasis
from workflows.domain.incident import (
    ActionKind,
    ActionRecord,
    Anomaly,
    AnomalyKind,
    Attribution,
    Evidence,
    EvidenceSource,
    FailureClass,
    Incident,
)
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

SINCE = datetime(2025, 1, 1, 0, 0, 0, tzinfo=UTC)
UNTIL = SINCE + timedelta(hours=10)
CLUSTER = "audit-test"


def at(seconds: float, base: datetime = SINCE) -> datetime:
    return base + timedelta(seconds=seconds)


def _att(cls: FailureClass, cause: str, *nodes: str, retryable: bool = True) -> Attribution:
    return Attribution(failure_class=cls, cause=cause, retryable=retryable, confidence=0.9, implicated_nodes=nodes)


def _requeue(job: int, n: int, decided: datetime, verified: datetime) -> ActionRecord:
    return ActionRecord(
        key=f"k/{job}-{n}/requeue", kind=ActionKind.REQUEUE, target=str(job), decided_at=decided, verified_at=verified
    )


def job_101_incidents(base: datetime = SINCE) -> tuple[Incident, ...]:
    def t(s: float) -> datetime:
        return at(s, base)

    crash = Anomaly(
        kind=AnomalyKind.RANK_CRASH,
        observed_at=t(3600),
        summary="rank 3 died: CUDA error",
        evidence=(Evidence(source=EvidenceSource.LOGS, text="Xid 79", node="n1", at=t(3598)),),
    )
    first = Incident(
        number=1,
        id="101-1",
        detected_at=t(3600),
        anomaly=crash,
        attribution=_att(FailureClass.HARDWARE, "xid-79", "n1"),
        actions=(
            ActionRecord(
                key="k/101-1/drain-n1", kind=ActionKind.DRAIN, target="n1", decided_at=t(3621), verified_at=t(3625)
            ),
            _requeue(101, 1, t(3626), t(3630)),
        ),
        restarted_at=t(3630),
        resumed_at=t(3900),
        outcome="resumed",
    )
    gpu = Anomaly(
        kind=AnomalyKind.GPU_FAULT,
        observed_at=t(10800),
        summary="xid on n2 GPU 1 (XID 79)",
        gpu_events=(GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=79, observed_at=t(10790)),),
    )
    second = Incident(
        number=2,
        id="101-2",
        detected_at=t(10800),
        anomaly=gpu,
        attribution=_att(FailureClass.HARDWARE, "xid-79", "n2"),
        actions=(
            ActionRecord(key="k/101-2/drain-n2", kind=ActionKind.DRAIN, target="n2", decided_at=t(10810)),
            _requeue(101, 2, t(10850), t(10860)),
        ),
        restarted_at=t(10860),
        outcome="failed again before resuming",
    )
    third = Incident(
        number=3,
        id="101-3",
        detected_at=t(11400),
        anomaly=Anomaly(kind=AnomalyKind.RANK_CRASH, observed_at=t(11400), summary="restarted job failed"),
        attribution=_att(FailureClass.INFRASTRUCTURE, "node-down", "n3"),
        actions=(_requeue(101, 3, t(11405), t(11420)),),
        restarted_at=t(11420),
        resumed_at=t(12000),
        outcome="resumed",
    )
    fourth = Incident(
        number=4,
        id="101-4",
        detected_at=t(18000),
        anomaly=Anomaly(kind=AnomalyKind.STRAGGLER, observed_at=t(18000), summary="rank 5 on n1 is 1.4x slower"),
        attribution=_att(FailureClass.HARDWARE, "straggler", "n1"),
        outcome="reported (straggler action: report)",
    )
    return first, second, third, fourth


def job_202_incidents(base: datetime = SINCE) -> tuple[Incident, ...]:
    hang = HangVerdict(hung=True, window_s=60, basis=WindowBasis.FLOOR, window_detail="floor 60 s", silent_for_s=90)
    return (
        Incident(
            number=1,
            id="202-1",
            detected_at=at(14400, base),
            anomaly=Anomaly(kind=AnomalyKind.HANG, observed_at=at(14400, base), summary="no rank progressed"),
            attribution=_att(FailureClass.USER, "user-bug", retryable=False),
            hang=hang,
            outcome="not retryable",
        ),
    )


def job_303_incidents(base: datetime = SINCE) -> tuple[Incident, ...]:
    return (
        Incident(
            number=1,
            id="303-1",
            detected_at=at(-600, base),
            anomaly=Anomaly(kind=AnomalyKind.NODE_FAILURE, observed_at=at(-600, base), summary="n4 is DOWN"),
            attribution=_att(FailureClass.INFRASTRUCTURE, "node-down", "n4"),
            actions=(_requeue(303, 1, at(-590, base), at(-580, base)),),
            restarted_at=at(-580, base),
            resumed_at=at(600, base),
            outcome="resumed",
        ),
    )


def status(
    job_id: int, incidents: tuple[Incident, ...], state: RecoveryState = RecoveryState.WATCHING
) -> JobRecoveryStatus:
    return JobRecoveryStatus(
        cluster=CLUSTER, job_id=job_id, state=state, job_name=f"train-{job_id}", incidents=incidents
    )


def approval(
    n: int,
    kind: ApprovalKind,
    job_id: int,
    requested: float,
    *nodes: str,
    decided: float | None = None,
    outcome: ApprovalOutcome = ApprovalOutcome.PENDING,
    by: str = "",
    incident: int = 1,
    base: datetime = SINCE,
) -> Approval:
    """An approval as the Fleet holds it; an expired one applied the default (rejected)."""
    req = IsolationRequest(
        request_id=f"rebound/{CLUSTER}/job/{job_id}/incident-{incident}",
        reply_to=f"rebound/{CLUSTER}/job/{job_id}",
        job_id=job_id,
        incident=f"{job_id}-{incident}",
        cause="xid-79",
        nodes=nodes,
        requested_at=at(requested, base),
    )
    decided_outcome = outcome is not ApprovalOutcome.PENDING
    return Approval(
        id=f"a-{n}",
        kind=kind,
        request=req,
        nodes=nodes if kind is ApprovalKind.DRAIN else (),
        requested_at=at(requested, base),
        deadline=at(requested + 900, base),
        outcome=outcome,
        decided_by=by,
        decided_at=at(decided, base) if decided is not None else None,
        applied=(ApprovalOutcome.REJECTED if outcome is ApprovalOutcome.EXPIRED else outcome)
        if decided_outcome
        else None,
    )


def fleet_approvals(base: datetime = SINCE) -> tuple[Approval, ...]:
    """The Fleet's approvals of the module docstring, in the Fleet's order (by number)."""
    drain, restart = ApprovalKind.DRAIN, ApprovalKind.RESTART
    ok, no, expired = ApprovalOutcome.APPROVED, ApprovalOutcome.REJECTED, ApprovalOutcome.EXPIRED
    return (
        approval(1, drain, 99, -3000, "n9", decided=-2000, outcome=ok, by="bob", base=base),
        approval(2, drain, 101, 3601, "n1", decided=3621, outcome=ok, by="alice", base=base),
        approval(3, drain, 101, 10810, "n2", incident=2, base=base),
        approval(4, restart, 202, -600, decided=300, outcome=no, by="bob", base=base),
        approval(5, drain, 303, 20000, "n5", decided=20900, outcome=expired, base=base),
        approval(6, restart, 101, 35000, decided=36600, outcome=ok, by="alice", incident=5, base=base),
        approval(7, drain, 101, 36500, "n7", incident=6, base=base),
        approval(8, drain, 404, -7200, "n8", base=base),
        approval(9, drain, 101, 12000, "n3", decided=12060, outcome=ok, by="carol", incident=3, base=base),
    )
