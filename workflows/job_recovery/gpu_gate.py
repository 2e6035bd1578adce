"""Before a signalled GPU fault becomes an incident: the node's own agent must list it (``policy.gpu_claims``).

A forged ``gpu_fault_reported`` signal would otherwise interrupt the watch and start an incident (attribution,
perhaps a restart) for a job that is fine. Here the signalled events are taken, each node named is read afresh
through its agent, and only the events an agent lists make the anomaly; none: no incident, the watch goes on, and
the timeline says what was ignored.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.state as state
    from workflows.domain.incident import Anomaly
    from workflows.job_recovery.evidence import read_all_gpus
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.gpu_claims import confirm_gpu_events

__all__ = ["PATCH", "confirmed_gpu_anomaly"]

#: A GPU fault anomaly is made of agent-confirmed events only (issue 13); histories from before took every signal.
PATCH = "13-gpu-anomaly-confirmed"


async def confirmed_gpu_anomaly(rec: Recorder, anomaly: Anomaly) -> Anomaly | None:
    """The anomaly with only the events their nodes' agents list; None when no event is confirmed."""
    rec.state, signalled = state.take_gpu_events(rec.state)
    claimed = (*anomaly.gpu_events, *(e for e in signalled if e not in anomaly.gpu_events))
    hosts = tuple(dict.fromkeys(e.host for e in claimed))
    reports = dict(zip(hosts, await read_all_gpus(hosts), strict=True))
    kept, notes = confirm_gpu_events(claimed, reports)
    for note in notes:
        rec.record("GPU_CLAIM", note)
    if not kept:
        return None
    return anomaly.model_copy(
        update={
            "gpu_events": kept,
            "observed_at": min((e.observed_at for e in kept if e.observed_at is not None), default=anomaly.observed_at),
        }
    )
