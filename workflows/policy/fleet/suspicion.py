"""Suspicions: nodes excluded from one job's placement on the job's word alone, and when that stops being enough.

A request on the ``exclude`` rung (``workflows.policy.action_ladder``) asks the Fleet to record a suspicion of its
nodes, not to drain them. A node implicated before, within ``suspicion_window_s`` (by this job's earlier incident
or by another job), is implicated again: that repeat is the node-level evidence a drain needs, and the node goes on
to the drain rules naming both incidents. Implications from before the node last came back to service (a drain
Rebound made, then its health check or an operator returned it: ``NodeRecord.returned_at``) were dealt with and
do not count. The rest stay suspicions: excluded from the job's next placement, unless
that would leave its partition too few nodes to place it (then less is done, and the reason says so). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from workflows.domain.fleet import FleetPolicy, FleetState, IsolationRequest, NodeIncident
from workflows.domain.progress import aware
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.fleet.common import age_s, span, unique, within

__all__ = [
    "MAX_JOB_EXCLUSIONS",
    "active_suspicions",
    "earlier_implications",
    "fit_exclusion",
    "repeat_reason",
    "standing_exclusion",
]

#: A job's standing exclusion keeps at most this many nodes (the newest): an old suspicion gives way to new ones.
MAX_JOB_EXCLUSIONS = 8

#: Base states in which a node can still take the job (a drained or unreachable one cannot).
_PLACEABLE = frozenset({NodeBaseState.IDLE, NodeBaseState.MIXED, NodeBaseState.ALLOCATED})


def earlier_implications(state: FleetState, req: IsolationRequest, window_s: float) -> dict[str, list[NodeIncident]]:
    """Node of ``req`` -> the earlier incidents (other requests, any job) that implicated it within ``window_s``
    of this request's failure (closed window, compared by when each was reported) and after it last came back to
    service, oldest first."""
    out: dict[str, list[NodeIncident]] = {}
    for name in unique(req.nodes):
        record = state.nodes.get(name)
        if record is None:
            continue
        earlier = [
            i
            for i in record.incidents
            if i.request_id != req.request_id
            and abs(age_s(req.requested_at, i.at)) <= window_s
            and (record.returned_at is None or aware(i.at) > aware(record.returned_at))
        ]
        if earlier:
            out[name] = sorted(earlier, key=lambda i: aware(i.at))
    return out


def repeat_reason(node: str, earlier: Sequence[NodeIncident], req: IsolationRequest, window_s: float) -> str:
    """``n2: implicated again within 1d: 42-1 (rank-killed, job 42) and now 42-2 (rank-crash): drain requested``."""
    before = ", ".join(f"{i.incident} ({i.cause}, job {i.job_id})" for i in earlier[-3:])
    return (
        f"{node}: implicated again within {span(window_s)}: {before} and now {req.incident} ({req.cause}, "
        f"job {req.job_id}): the repeat is node-level evidence: drain requested"
    )


def _placeable(node: SlurmNode) -> bool:
    return node.state in _PLACEABLE and not node.is_drained and node.is_responding


def _partition_nodes(view: ClusterSnapshot, partition: str) -> list[SlurmNode]:
    """The nodes of the job's partitions (a pending job may list several, comma-separated); all when unknown."""
    wanted = {p.strip() for p in partition.split(",") if p.strip()}
    return [n for n in view.nodes if not wanted or wanted.intersection(n.partitions)]


def _size_check(req: IsolationRequest, nodes: Sequence[SlurmNode]) -> tuple[Callable[[SlurmNode], bool], str, str]:
    """Whether a node is big enough for one of the job's nodes, what that means (``with 2 GPUs, 8 CPUs``), and
    how the check reads for people. A resource is checked only when the job's need and every node's size are known;
    with neither, the count is rough (placeable nodes, whatever their size), and the note says so."""
    gpus, cpus = req.gpus_per_node, req.cpus_per_node
    by_gpus = gpus is not None and all(n.gpus is not None for n in nodes)
    by_cpus = cpus > 0 and all(n.cpus > 0 for n in nodes)
    wants = ([f"{gpus} GPUs" if gpus else "no GPUs"] if by_gpus else []) + ([f"{cpus} CPUs"] if by_cpus else [])
    unknown = [w for w, known in (("GPUs", by_gpus), ("CPUs", by_cpus)) if not known]

    def fits(node: SlurmNode) -> bool:
        return (not by_gpus or (node.gpus or 0) >= (gpus or 0)) and (not by_cpus or node.cpus >= cpus)

    if not wants:
        note = (
            "placement check was rough: placeable nodes counted whatever their size (the job's GPUs and CPUs per "
            "node, or the nodes' sizes, are unknown)"
        )
        return fits, "", note
    unchecked = f"; {' and '.join(unknown)} unknown, not checked" if unknown else ""
    return fits, f" with {', '.join(wants)}", f"placement checked per node: {', '.join(wants)} each{unchecked}"


def fit_exclusion(
    view: ClusterSnapshot, req: IsolationRequest, unavailable: Sequence[str], suspects: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The suspects the job can do without, and the reasons: excluding more than its partition can spare would
    leave the job unplaceable (pending for ever), so the exclusion is dropped and the restart goes ahead without it.

    ``unavailable``: nodes out of this placement whatever happens (drained, waiting for an operator, already
    excluded). A job whose node count is unknown gets every exclusion (the safe side for one job's placement).
    A node counts only if it can hold one of the job's nodes (GPUs, CPUs: ``_size_check``).
    """
    if not suspects:
        return [], []
    if req.node_count <= 0:
        return list(suspects), []
    out = set(unavailable) | set(req.excluded_before) | set(req.owner_excluded)
    candidates = [n for n in _partition_nodes(view, req.partition) if _placeable(n) and n.name not in out]
    fits, sized, note = _size_check(req, candidates)
    left = [n.name for n in candidates if fits(n) and n.name not in set(suspects)]
    if len(left) >= req.node_count:
        return list(suspects), [note]
    where = req.partition or "the cluster"
    return [], [
        f"{', '.join(suspects)}: not excluded: the job needs {req.node_count} nodes{sized} and {where} would keep "
        f"{len(left)} placeable without {'it' if len(suspects) == 1 else 'them'}; restarted without this exclusion "
        "(suspicion still recorded)",
        note,
    ]


def standing_exclusion(req: IsolationRequest, added: Sequence[str]) -> tuple[str, ...]:
    """The job's own exclusion after this request: what it kept before plus the new suspects, the newest
    ``MAX_JOB_EXCLUSIONS``."""
    kept = unique([*(n for n in req.excluded_before if n not in added), *added])
    return tuple(kept[-MAX_JOB_EXCLUSIONS:])


def active_suspicions(state: FleetState, policy: FleetPolicy, now: datetime) -> list[tuple[str, NodeIncident]]:
    """(node, suspicion) still within ``suspicion_window_s``, newest first: what ``rebound nodes`` lists (another
    implication of such a node drains it)."""
    found = [
        (name, i)
        for name, record in state.nodes.items()
        for i in record.incidents
        if i.suspicion and within(i.at, now, policy.suspicion_window_s)
    ]
    return sorted(found, key=lambda pair: (aware(pair[1].at), pair[0]), reverse=True)
