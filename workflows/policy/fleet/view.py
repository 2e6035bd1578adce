"""The Fleet's view of a cluster snapshot (``workflows.domain.fleet_view``), and what it must show. Pure.

The view activity builds it from a fresh snapshot on the worker, so only the view enters the Fleet's history;
a Fleet replaying a history from before (the whole snapshot in it) reads the same view of that snapshot
(``as_fleet_view``), and so decides the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from workflows.domain.fleet import FleetState, IsolationRequest
from workflows.domain.fleet_view import FleetView, FleetViewInput, JobAllocation, PlaceableNodes
from workflows.domain.slurm import ClusterSnapshot, JobState, NodeBaseState, SlurmNode
from workflows.policy.fleet.common import unique

__all__ = ["as_fleet_view", "build_fleet_view", "in_partition", "is_placeable", "view_input"]

#: Base states in which a node can still take a job (a drained or unreachable one cannot).
_PLACEABLE = frozenset({NodeBaseState.IDLE, NodeBaseState.MIXED, NodeBaseState.ALLOCATED})


def is_placeable(node: SlurmNode) -> bool:
    """True when the scheduler could place a job's node on it now."""
    return node.state in _PLACEABLE and not node.is_drained and node.is_responding


def in_partition(node: SlurmNode, partition: str) -> bool:
    """True when the node belongs to one of ``partition``'s comma-separated partitions (any node for "")."""
    wanted = {p.strip() for p in partition.split(",") if p.strip()}
    return not wanted or bool(wanted.intersection(node.partitions))


def view_input(state: FleetState, req: IsolationRequest | None = None, nodes: Iterable[str] = ()) -> FleetViewInput:
    """What a read for the Fleet must show: the nodes of its records, ``nodes``, and for a request its nodes, its
    exclusions and the placement counts of its partition."""
    named = [*state.nodes, *nodes]
    if req is None:
        return FleetViewInput(nodes=tuple(unique(named)))
    named += [*req.nodes, *req.excluded_before, *req.owner_excluded]
    return FleetViewInput(nodes=tuple(unique(named)), partition=req.partition, job_id=req.job_id)


def build_fleet_view(snapshot: ClusterSnapshot, inp: FleetViewInput) -> FleetView:
    """The view ``inp`` asks for, from a snapshot of the whole cluster."""
    asked = set(inp.nodes)
    sizes: Counter[str] = Counter(p for n in snapshot.nodes for p in set(n.partitions))
    placeable: Counter[tuple[int | None, int]] = Counter()
    if inp.partition is not None:
        placeable.update((n.gpus, n.cpus) for n in snapshot.nodes if is_placeable(n) and in_partition(n, inp.partition))
    return FleetView(
        observed_at=snapshot.observed_at,
        asked=inp.nodes,
        node_count=len(snapshot.nodes),
        partition_sizes=dict(sorted(sizes.items())),
        nodes=tuple(n for n in snapshot.nodes if n.name in asked),
        partition=inp.partition,
        placeable=tuple(
            PlaceableNodes(gpus=gpus, cpus=cpus, count=count)
            for (gpus, cpus), count in sorted(placeable.items(), key=lambda kv: (kv[0][0] is None, kv[0]))
        ),
        job=None if inp.job_id is None else _allocation(snapshot, inp.job_id),
    )


def _allocation(snapshot: ClusterSnapshot, job_id: int) -> JobAllocation:
    job = snapshot.job(job_id)
    if job is None:
        return JobAllocation(job_id=job_id, listed=False)
    # A completing job lists only its nodes still completing; where the scheduler also gives the whole
    # allocation, that is the allocation and nothing needs to wait for the listing to fill up again.
    completing = job.state is JobState.COMPLETING and not job.allocated_nodes
    nodes = job.allocated_nodes or job.nodes
    return JobAllocation(job_id=job_id, listed=True, user=job.user, nodes=nodes, completing=completing)


def as_fleet_view(
    view: FleetView | ClusterSnapshot, state: FleetState, req: IsolationRequest | None = None
) -> FleetView:
    """The view the Fleet's rules read. A whole snapshot (a history from before the compact view, a test) is read
    as the view the activity would have returned for ``state`` and ``req``, so both decide the same way."""
    return view if isinstance(view, FleetView) else build_fleet_view(view, view_input(state, req))
