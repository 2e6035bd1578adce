"""``rebound bench sources``: scoring one run against its source, the summary and the table (pure)."""

from __future__ import annotations

import pytest

from deploy.bench.sources import (
    SOURCES,
    SourceRun,
    format_sources_table,
    is_detected,
    parse_sources,
    score_source_run,
    sources_report,
)
from tests.unit.bench.builders import T0, at, status
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import (
    Anomaly,
    AnomalyKind,
    Attribution,
    EvidenceKind,
    FailureClass,
    Incident,
    TimelineEntry,
)
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState


def _incident(
    kind: AnomalyKind,
    *,
    number: int = 1,
    detected: float = 0.4,
    event_source: str = "",
    basis: str = "none",
    attributed: bool = True,
) -> Incident:
    events = (GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=79, source=event_source),) if event_source else ()
    return Incident(
        number=number,
        id=f"12-{number}",
        detected_at=at(detected),
        anomaly=Anomaly(kind=kind, observed_at=at(detected), summary="x", gpu_events=events),
        attribution=Attribution(
            failure_class=FailureClass.HARDWARE,
            cause="xid-79",
            retryable=True,
            confidence=0.9,
            implicated_nodes=("n2",),
            basis=EvidenceKind(basis),
        )
        if attributed
        else None,
    )


def _with_timeline(st: JobRecoveryStatus, *entries: tuple[float, str, int]) -> JobRecoveryStatus:
    return st.model_copy(
        update={"timeline": tuple(TimelineEntry(at=at(s), event=e, incident=n) for s, e, n in entries)}
    )


def _score(
    source: str, st: JobRecoveryStatus | None, before: set[int] | None = None, timed_out: bool = False
) -> SourceRun:
    return score_source_run(
        source=source,  # type: ignore[arg-type]  # the tests pass plain strings
        index=1,
        run="r",
        job_id=12,
        node="n2",
        t0=T0,
        status=st,
        before=before or set(),
        timed_out=timed_out,
        wall_s=30.04,
    )


def test_parse_sources_keeps_order_and_refuses_unknown_names() -> None:
    assert parse_sources(None) == SOURCES == ("kernel", "nvml", "dcgm", "scheduler", "logs")
    assert parse_sources("logs, kernel,logs") == ("logs", "kernel")
    with pytest.raises(ValueError, match="unknown source 'dmesg'"):
        parse_sources("kernel,dmesg")
    with pytest.raises(ValueError, match="no source"):
        parse_sources(" , ")


def test_kernel_run_measures_the_first_observation_and_the_recorded_entry() -> None:
    inc = _incident(AnomalyKind.GPU_FAULT, detected=0.35, event_source="kernel log")
    st = _with_timeline(status(inc), (0.9, "DETECTED", 1), (1.4, "ATTRIBUTED", 1))
    r = _score("kernel", st)
    assert not r.failed and r.via_source
    assert (r.latency_s, r.detected_s, r.recorded_s, r.verdict_s) == (0.35, 0.35, 0.9, 1.4)
    assert r.event_sources == ("kernel log",) and r.anomaly == "gpu_fault" and r.wall_s == 30.0


def test_a_run_detected_through_another_source_is_failed_not_a_sample() -> None:
    # An XID written to the kernel log but reported by NVML measures NVML, not the kernel log.
    r = _score("kernel", status(_incident(AnomalyKind.GPU_FAULT, event_source="nvml")))
    assert r.failed and not r.via_source
    assert r.error == "detected as gpu_fault from nvml, not through kernel"
    r = _score("scheduler", status(_incident(AnomalyKind.RANK_CRASH)))
    assert r.failed and r.error == "detected as rank_crash, not through scheduler"
    assert not _score("scheduler", status(_incident(AnomalyKind.NODE_FAILURE))).failed
    assert not _score("logs", status(_incident(AnomalyKind.RANK_CRASH))).failed
    assert not _score("nvml", status(_incident(AnomalyKind.GPU_FAULT, event_source="nvml"))).failed


def test_dcgm_is_measured_to_the_verdict_that_rests_on_dcgm() -> None:
    inc = _incident(AnomalyKind.RANK_CRASH, detected=0.2, basis="gpu-dcgm")
    st = _with_timeline(status(inc), (0.5, "DETECTED", 1), (2.25, "ATTRIBUTED", 1))
    r = _score("dcgm", st)
    assert not r.failed and r.latency_s == 2.25 and r.detected_s == 0.2 and r.basis == "gpu-dcgm"
    r = _score("dcgm", status(_incident(AnomalyKind.RANK_CRASH, basis="rank-exit")))
    assert r.failed and r.error == "verdict rests on rank-exit, not DCGM"


def test_incidents_before_the_fault_are_not_the_runs_and_none_after_is_a_failure() -> None:
    old = _incident(AnomalyKind.RANK_CRASH, number=1, detected=-5)
    r = _score("logs", status(old), before={1}, timed_out=True)
    assert r.failed and r.error == "timeout: no incident after the fault (state WATCHING)"
    assert _score("logs", None).error == "no status from the workflow"
    new = _incident(AnomalyKind.RANK_CRASH, number=2, detected=0.7)
    assert _score("logs", status(old, new), before={1}).detected_s == 0.7


def test_is_detected_waits_for_the_attribution_only_for_dcgm() -> None:
    pending = status(_incident(AnomalyKind.RANK_CRASH, attributed=False))
    assert is_detected("logs", pending, set())
    assert not is_detected("dcgm", pending, set())
    assert is_detected("dcgm", status(_incident(AnomalyKind.RANK_CRASH)), set())
    assert not is_detected("logs", pending, {1})
    assert is_detected("logs", status(state=RecoveryState.GAVE_UP), set())


def test_report_has_p50_p99_over_successful_runs_and_lists_failures() -> None:
    runs = [
        _score("kernel", status(_incident(AnomalyKind.GPU_FAULT, detected=d, event_source="kernel log")))
        for d in (0.2, 0.4, 1.0)
    ]
    runs.append(_score("kernel", status(_incident(AnomalyKind.GPU_FAULT, event_source="nvml"))))
    runs.append(_score("logs", None))
    report = sources_report(runs, ("kernel", "logs"))
    kernel = report["sources"]["kernel"]
    assert (kernel["runs"], kernel["failed_runs"]) == (4, 1)
    assert kernel["latency_s"] == {"n": 3, "mean": 0.533, "p50": 0.4, "p99": 0.988, "max": 1.0}
    assert kernel["errors"] == ["#1: detected as gpu_fault from nvml, not through kernel"]
    assert report["sources"]["logs"]["latency_s"] is None
    table = format_sources_table(report).splitlines()
    assert table[0].split()[:4] == ["source", "fault", "runs", "ok"]
    assert table[2].startswith("kernel ") and "0.40/0.99" in table[2] and " 4  " in table[2]
    assert table[3].startswith("logs ") and table[3].split()[-5:] == ["-", "first", "observation", "-", "-"]
    assert len(report["runs"]) == 5
