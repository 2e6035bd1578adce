"""Hand-built injection records, incidents, statuses and lab logs for the benchmark's unit tests (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deploy.bench.scoring import RunResult, score_run
from deploy.demo.injections import InjectionRecord
from workflows.domain.incident import (
    ActionKind,
    ActionRecord,
    Anomaly,
    AnomalyKind,
    Attribution,
    FailureClass,
    Incident,
)
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

T0 = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
JOB = 12


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(kind: str = "crash", *, node: str | None = "n2", rank: int | None = 2) -> InjectionRecord:
    return InjectionRecord.model_validate(
        {
            "id": f"{kind}-0001",
            "kind": kind,
            "run": "r",
            "job_id": JOB,
            "restart": 0,
            "rank": rank,
            "node": node,
            "gpu": None,
            "xid": None,
            "t0": T0,
            "t0_epoch": T0.timestamp(),
            "injected_at": T0,
        }
    )


def drain(node: str, verified: float = 1.0) -> ActionRecord:
    return ActionRecord(
        key=f"k/drain-{node}", kind=ActionKind.DRAIN, target=node, decided_at=at(0.9), verified_at=at(verified)
    )


def requeue(verified: float = 1.5) -> ActionRecord:
    return ActionRecord(
        key="k/requeue", kind=ActionKind.REQUEUE, target=str(JOB), decided_at=at(1.1), verified_at=at(verified)
    )


def incident(
    *,
    number: int = 1,
    nodes: tuple[str, ...] = ("n2",),
    cause: str = "rank-crash",
    failure_class: FailureClass = FailureClass.UNKNOWN,
    retryable: bool = True,
    actions: tuple[ActionRecord, ...] = (),
    detected: float = 0.2,
    restarted: float | None = 1.5,
    resumed: float | None = 14.0,
) -> Incident:
    return Incident(
        number=number,
        id=f"{JOB}-{number}",
        detected_at=at(detected),
        anomaly=Anomaly(kind=AnomalyKind.RANK_CRASH, observed_at=at(detected), summary="rank 2 died"),
        attribution=Attribution(
            failure_class=failure_class,
            cause=cause,
            retryable=retryable,
            confidence=0.6,
            implicated_nodes=nodes,
        ),
        actions=actions,
        restarted_at=at(restarted) if restarted is not None else None,
        resumed_at=at(resumed) if resumed is not None else None,
        resumed_from="step_000020" if resumed is not None else "",
        outcome="resumed" if resumed is not None else "",
    )


def status(*incidents: Incident, state: RecoveryState = RecoveryState.WATCHING, restarts: int = 1) -> JobRecoveryStatus:
    return JobRecoveryStatus(cluster="lab", job_id=JOB, state=state, incidents=incidents, restart_count=restarts)


def line(seconds: float, msg: str, rank: int = 0, node: str = "n1") -> str:
    t = at(seconds)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z [INFO] rank={rank}/4 node={node} {msg}"


RANK0_LOG = [
    line(-10, "starting: job_id=12 restart=0 world_size=4 local_rank=0 gpu=0 pid=1 rendezvous=x steps=9 x=1"),
    line(-9.9, "no checkpoint found, starting from step 0"),
    line(-9.8, "step=1 loss=0.5 step_time=0.1s"),
    line(-3, "step=20 loss=0.5 step_time=0.1s"),
    line(-2.9, "saved checkpoint step_000020 (step 20, 100 bytes, 0.01s)"),
    line(-0.1, "step=32 loss=0.5 step_time=0.1s"),
    "Traceback (most recent call last):",
    "RuntimeError: Connection closed by peer",
    line(8, "starting: job_id=12 restart=1 world_size=4 local_rank=0 gpu=0 pid=2 rendezvous=x steps=9 x=1", node="n3"),
    line(13.5, "resumed from checkpoint step_000020 (step 20)", node="n3"),
    line(14, "step=21 loss=0.5 step_time=0.1s", node="n3"),
    line(14.1, "step=22 loss=0.5 step_time=0.1s", node="n3"),
]
BATCH_LOG = [
    f"{at(-11):%Y-%m-%dT%H:%M:%S}.000Z [INFO] batch job_id=12 restart=0 nodes=n[1-2] ntasks=4 batch_host=n1 gpus=0,1",
    f"{at(7.5):%Y-%m-%dT%H:%M:%S}.500Z [INFO] batch job_id=12 restart=1 nodes=n[1,3] ntasks=4 batch_host=n1 gpus=0,1",
]


def score(scenario: str, rec: InjectionRecord, st: JobRecoveryStatus | None, **kw: object) -> RunResult:
    args: dict[str, object] = {
        "scenario": scenario,
        "index": 1,
        "run": "r",
        "record": rec,
        "status": st,
        "before": set(),
        "rebound_drains": (),
        "rank0_log": RANK0_LOG,
        "batch_log": BATCH_LOG,
        "timed_out": False,
        "wall_s": 30.0,
    }
    args.update(kw)
    return score_run(**args)  # type: ignore[arg-type]
