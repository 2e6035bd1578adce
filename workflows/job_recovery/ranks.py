"""Which rank runs on which node, taken while the attempt runs: the node agents' view of the job's processes.

A rank that dies takes its process (and so its own word on where it ran) with it; asked only after a failure, the
agents can no longer place it. So JobRecovery asks once per attempt, ``rank_map_after_s`` after it first sees the
attempt running, in a task beside the watch, and keeps the map in its state (``JobRecoveryState.rank_map``) for
the attribution (which merges a fresh look under it). The look is repeated a few times while some job node
shows no rank yet.
A restart drops the map (``state.new_attempt``); a look that ends after a restart is not kept.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.evidence as evidence
    from workflows.domain.ranks import RankMap
    from workflows.domain.slurm import JobState, SlurmJob
    from workflows.job_recovery.recorder import Recorder
    from workflows.policy.rank_map import merge_maps

__all__ = ["RANK_MAP_CAPTURE", "capture", "describe", "wanted"]

#: Patch id (ADR 012): the watch is accompanied by one rank-map look per attempt.
RANK_MAP_CAPTURE = "rank-map-capture"
#: Looks per attempt while no rank process is up yet (torchrun still in rendezvous, a slow start).
MAX_LOOKS = 3


def wanted(rec: Recorder, job: SlurmJob) -> bool:
    """The attempt runs on known nodes and its ranks are not placed yet."""
    return job.state is JobState.RUNNING and bool(job.nodes) and rec.state.rank_map is None


async def capture(rec: Recorder, job: SlurmJob) -> None:
    """Wait for the ranks to start, then ask every node agent which ranks run there; keep the map in the state.

    Asked again (after twice, then three times the delay) while some job node shows no rank yet; what one look
    placed stays placed. The last look's map is kept whatever it holds, with why the rest is unknown.
    """
    restarts = rec.status.restart_count
    partial = None
    for look in range(MAX_LOOKS):
        await workflow.sleep(
            rec.inp.detection.rank_map_after_s * (look + 1),
            summary="let the ranks start before asking the node agents which rank runs where",
        )
        if rec.status.restart_count != restarts or rec.state.rank_map is not None:
            return  # restarted meanwhile
        found = await evidence.rank_map(rec.inp.job_id, job.nodes)
        if rec.status.restart_count != restarts:
            return
        partial = merge_maps(found, partial)
        if {s.node for s in partial.ranks} >= set(job.nodes) or look == MAX_LOOKS - 1:
            rec.update(rank_map=partial)
            rec.record("RANKS", describe(partial))
            return


def describe(found: RankMap) -> str:
    """The timeline's line: how many ranks on how many nodes, the launcher, and where (``0-1@n1 2-3@n2``)."""
    placed = sum(s.last - s.first + 1 for s in found.ranks)
    head = f"{placed} rank(s) placed on {len({s.node for s in found.ranks})} node(s), launcher {found.launcher.value}"
    if not placed:
        return f"{head}: {found.unknown}"
    where = " ".join(
        f"{s.first}@{s.node}" if s.first == s.last else f"{s.first}-{s.last}@{s.node}" for s in found.ranks
    )
    return f"{head}: {where}"[:400]
