"""Scoring and reporting of ``rebound bench scale`` (pure): incidents against the injector's record, the costs,
the table and the JSON shape of issue 12.

Per fault, the job's first incident detected at or after the fault's ``t0`` (less ``CLOCK_SLACK_S``: the
workflow's clock and the injector's are the same host's, but ``detected_at`` is the workflow task's time) answers
it: ``detection_s = detected_at - t0``; ``action_s = restarted_at - detected_at`` (``Incident.recovery_action_s``,
the last recovery action verified by the scheduler, as ``rebound bench recovery`` measures it). An incident on a
job no fault touched, or before its fault, is false. A later incident of a faulted job (its restart failing
again) is counted apart (``extra_incidents``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from deploy.scale.faults import FaultKind, InjectedFault
from workflows.domain.incident import Incident
from workflows.policy.stats import percentile

__all__ = ["CLOCK_SLACK_S", "Costs", "FaultOutcome", "Latency", "RunResult", "format_table", "report_json", "score"]

CLOCK_SLACK_S = 1.0


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Latency(_Model):
    p50: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> Latency:
        present = sorted(values)
        if not present:
            return cls()
        return cls(p50=round(percentile(present, 50), 3), p99=round(percentile(present, 99), 3))


class FaultOutcome(_Model):
    kind: FaultKind
    job_id: int
    t0: float
    detected_s: float | None = None
    action_s: float | None = None
    anomaly: str = ""


class Costs(_Model):
    """What the samplers and the server's metrics measured over the window."""

    window_s: float
    worker_cpu_cores: float
    worker_rss_mb: float
    server_cpu_cores: float
    server_rss_mb: float
    machine_cpu_cores: float
    actions: float
    heartbeats: float
    history_events: int
    snapshot_parse_s: float
    agents_cpu_cores: float = 0.0
    writer_cpu_cores: float = 0.0


class RunResult(_Model):
    jobs: int
    ranks: int
    workers: int
    minutes: float
    costs: Costs
    faults: tuple[FaultOutcome, ...]
    false_incidents: int
    extra_incidents: int
    scheduler_commands: int = 0
    unknown_commands: tuple[str, ...] = ()
    waiting_activities: dict[str, int] = {}
    """Activities not started > 10 s after being scheduled, by type, at the window's end (starved of slots)."""
    restarts: int = 0
    """Requeued jobs' restarts the scheduler saw (a recovery that completed)."""
    jobs_recovering: int = 0
    """JobRecovery workflows running when the window opened (fewer than ``jobs``: discovery did not keep up)."""
    recovering_after_s: float | None = None
    """Seconds from the stack being up until every job had a JobRecovery (or the wait's timeout)."""
    steady_after_s: float | None = None
    """Seconds after that until the worker answered a sample of status queries promptly (``reads.wait_steady``):
    the start-up's backlog worked off; the window opens after it (and the warm-up)."""
    steady_query_s: float | None = None
    """The slowest status answer of the last sample before the window (above ``STEADY_QUERY_S``: never steady)."""
    takeover_s: float | None = None
    """Seconds from SIGKILLing a worker until the others' hubs held every job again (``--kill-worker-at``)."""

    def job_hours(self) -> float:
        return self.jobs * self.costs.window_s / 3600.0

    def detections(self, kind: FaultKind | None = None) -> list[float]:
        return [f.detected_s for f in self.faults if f.detected_s is not None and kind in (None, f.kind)]

    def actions(self) -> list[float]:
        return [f.action_s for f in self.faults if f.action_s is not None]


def _epoch(t: datetime) -> float:
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


def early_incidents(faults: Sequence[InjectedFault], incidents: Mapping[int, Sequence[Incident]]) -> list[str]:
    """One line per false incident (``score``'s count): the job, the fault it got (if any) and when, and what the
    incident said, so a run's false incidents can be read, not only counted."""
    by_job = {f.job_id: f for f in faults}
    out = []
    for job_id, found in sorted(incidents.items()):
        fault = by_job.get(job_id)
        for i in found:
            if fault is not None and _epoch(i.detected_at) >= fault.t0 - CLOCK_SLACK_S:
                continue
            when = "no fault" if fault is None else f"{fault.kind.value} {_epoch(i.detected_at) - fault.t0:+.1f} s"
            out.append(f"job {job_id} ({when}): {i.anomaly.kind.value}: {i.anomaly.summary[:160]}")
    return out


def score(
    faults: Sequence[InjectedFault], incidents: Mapping[int, Sequence[Incident]]
) -> tuple[tuple[FaultOutcome, ...], int, int]:
    """Each fault's outcome, the false incidents and the extra incidents (module docstring)."""
    by_job = {f.job_id: f for f in faults}
    outcomes: list[FaultOutcome] = []
    false_count = extra = 0
    for job_id, found in incidents.items():
        fault = by_job.get(job_id)
        if fault is None:
            false_count += len(found)
            continue
        early = [i for i in found if _epoch(i.detected_at) < fault.t0 - CLOCK_SLACK_S]
        false_count += len(early)
        extra += max(0, len(found) - len(early) - 1)
    for fault in faults:
        answers = sorted(
            (i for i in incidents.get(fault.job_id, ()) if _epoch(i.detected_at) >= fault.t0 - CLOCK_SLACK_S),
            key=lambda i: i.detected_at,
        )
        first = answers[0] if answers else None
        outcomes.append(
            FaultOutcome(
                kind=fault.kind,
                job_id=fault.job_id,
                t0=fault.t0,
                detected_s=None if first is None else round(max(0.0, _epoch(first.detected_at) - fault.t0), 3),
                action_s=None
                if first is None or first.recovery_action_s is None
                else round(first.recovery_action_s, 3),
                anomaly="" if first is None else first.anomaly.kind.value,
            )
        )
    return tuple(outcomes), false_count, extra


def _per(value: float, seconds: float) -> float:
    return round(value / seconds, 3) if seconds > 0 else 0.0


def report_json(runs: Sequence[RunResult]) -> dict[str, object]:
    """Issue 12's shape, exactly: ``{"runs": [{"jobs": N, ...}]}``."""
    out = []
    for r in runs:
        c, hours = r.costs, r.job_hours()
        detection, action = Latency.of(r.detections()), Latency.of(r.actions())
        out.append(
            {
                "jobs": r.jobs,
                "ranks": r.ranks,
                "workers": r.workers,
                "minutes": r.minutes,
                "worker_cpu_cores": c.worker_cpu_cores,
                "worker_rss_mb": c.worker_rss_mb,
                "server_cpu_cores": c.server_cpu_cores,
                "server_rss_mb": c.server_rss_mb,
                "machine_cpu_cores": c.machine_cpu_cores,
                "actions_per_s": _per(c.actions, c.window_s),
                "actions_per_job_hour": round(c.actions / hours, 1) if hours else 0.0,
                "heartbeats_per_s": _per(c.heartbeats, c.window_s),
                "events_per_job_hour": round(c.history_events / hours, 1) if hours else 0.0,
                "snapshot_parse_s": c.snapshot_parse_s,
                "detection_s": detection.model_dump(),
                "action_s": action.model_dump(),
                "faults_injected": len(r.faults),
                "faults_detected": sum(1 for f in r.faults if f.detected_s is not None),
                "false_incidents": r.false_incidents,
            }
        )
        if r.takeover_s is not None or r.workers > 1:
            # Beyond issue 12's keys, for multi-worker runs: the kill's takeover (null: no kill, or not every job
            # was held again before the window closed).
            out[-1]["takeover_s"] = r.takeover_s
        if r.steady_after_s is not None:
            # Beyond issue 12's keys: how long the start-up took (the window opens once the worker keeps up).
            out[-1]["recovering_after_s"] = r.recovering_after_s
            out[-1]["steady_after_s"] = r.steady_after_s
    return {"runs": out}


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(runs: Sequence[RunResult]) -> str:
    """A plain-text table, one column per run; detection per kind below the totals."""
    data = report_json(runs)["runs"]
    assert isinstance(data, list)
    rows: list[tuple[str, list[object]]] = (
        [(key, [d[key] for d in data]) for key in data[0] if key not in ("detection_s", "action_s")] if data else []
    )
    rows += [(f"detection_s {q}", [d["detection_s"][q] for d in data]) for q in ("p50", "p99")]
    rows += [(f"action_s {q}", [d["action_s"][q] for d in data]) for q in ("p50", "p99")]
    for kind in FaultKind:
        lat = [Latency.of(r.detections(kind)) for r in runs]
        seen = [f"{len(r.detections(kind))}/{sum(1 for f in r.faults if f.kind is kind)}" for r in runs]
        rows.append((f"{kind.value} detected", list(seen)))
        rows.append((f"{kind.value} detection p50/p99", [f"{_fmt(x.p50)}/{_fmt(x.p99)}" for x in lat]))
    rows.append(("extra incidents", [r.extra_incidents for r in runs]))
    rows.append(("restarts (scheduler)", [r.restarts for r in runs]))
    rows.append(("jobs with a JobRecovery", [r.jobs_recovering for r in runs]))
    rows.append(("slowest sampled status answer (s)", [r.steady_query_s for r in runs]))
    rows.append(("takeover after a worker kill (s)", [r.takeover_s for r in runs]))
    rows.append(("activities waiting a slot", [sum(r.waiting_activities.values()) for r in runs]))
    rows.append(("agents cpu cores", [r.costs.agents_cpu_cores for r in runs]))
    rows.append(("log writer cpu cores", [r.costs.writer_cpu_cores for r in runs]))
    width = max(len(name) for name, _ in rows) if rows else 0
    return "\n".join(f"{name:<{width}}  " + "  ".join(f"{_fmt(v):>12}" for v in values) for name, values in rows)
