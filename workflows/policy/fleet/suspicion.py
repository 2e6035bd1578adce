"""Suspicions: nodes excluded from one job's placement on the job's word alone, and when that stops being enough.

A request on the ``exclude`` rung (``workflows.policy.action_ladder``) asks the Fleet to record a suspicion of its
nodes, not to drain them. A job's output is a claim: a hostile user controls what their jobs print and can submit
many of them, so the same user's jobs implicating a node again prove nothing the first one did not. A node
implicated before, within ``suspicion_window_s``, is implicated again; what that repeat is worth depends on who
implicated it (``implicating_users``, the jobs' owners from the scheduler's records):

- jobs of at least two different known users: evidence no one user can forge; the node goes on to the drain
  rules, naming the incidents and the users (``repeat_reason``);
- only jobs of one user (or of unknown owners: an unknown owner is never "a different user"): the node stays a
  suspicion, excluded from the job's placement, and its drain waits for an operator's approval
  (``claim_reason``), rejected by default when nobody answers.

Implications from before the node last came back to service (a drain Rebound made, then its health check or an
operator returned it: ``NodeRecord.returned_at``) were dealt with and do not count. Suspicions are excluded from
the job's next placement, unless that would leave its partition too few nodes to place it (then less is done,
and the reason says so). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from workflows.domain.fleet import FleetPolicy, FleetState, IsolationRequest, NodeIncident
from workflows.domain.fleet_view import FleetView
from workflows.domain.progress import aware
from workflows.policy.fleet.common import age_s, span, unique, within
from workflows.policy.fleet.view import in_partition, is_placeable

__all__ = [
    "MAX_JOB_EXCLUSIONS",
    "active_suspicions",
    "claim_reason",
    "earlier_implications",
    "fit_exclusion",
    "implicating_users",
    "repeat_reason",
    "users_text",
    "standing_exclusion",
]

#: A job's standing exclusion keeps at most this many nodes (the newest): an old suspicion gives way to new ones.
MAX_JOB_EXCLUSIONS = 8


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


def implicating_users(earlier: Sequence[NodeIncident], req: IsolationRequest) -> list[str]:
    """The distinct known owners of the jobs that implicated the node (``earlier`` and now ``req``), sorted.
    Unknown owners (empty) are left out: they never make "another user"."""
    return sorted({u for u in (req.user, *(i.user for i in earlier)) if u})


def users_text(users: Sequence[str]) -> str:
    """``alice``, ``alice and bob``, ``alice, bob and carol``."""
    if len(users) <= 1:
        return "".join(users)
    return f"{', '.join(users[:-1])} and {users[-1]}"


def _incidents_text(earlier: Sequence[NodeIncident], req: IsolationRequest) -> str:
    def who(job: int, user: str) -> str:
        return f"job {job} of {user}" if user else f"job {job}"

    before = ", ".join(f"{i.incident} ({i.cause}, {who(i.job_id, i.user)})" for i in earlier[-3:])
    return f"{before} and now {req.incident} ({req.cause}, {who(req.job_id, req.user)})"


def repeat_reason(
    node: str, earlier: Sequence[NodeIncident], req: IsolationRequest, window_s: float, users: Sequence[str] = ()
) -> str:
    """``n2: implicated again within 1d: 42-1 (rank-killed, job 42 of alice) and now 7-1 (rank-crash, job 7 of
    bob): implicated by jobs of users alice and bob: drain requested``; without ``users``, the rule before job
    output was a claim (a repeat by anyone drained; histories recorded then)."""
    what = _incidents_text(earlier, req)
    if users:
        return (
            f"{node}: implicated again within {span(window_s)}: {what}: implicated by jobs of users "
            f"{users_text(users)}, evidence no one user's output can forge: drain requested"
        )
    return (
        f"{node}: implicated again within {span(window_s)}: {what}: the repeat is node-level evidence: drain requested"
    )


def claim_reason(
    node: str, earlier: Sequence[NodeIncident], req: IsolationRequest, window_s: float, users: Sequence[str]
) -> str:
    """``n2: implicated again within 1d only by jobs of user alice (...): a job's output is a claim: ...``."""
    who = f"only by jobs of user {users[0]}" if users else "only by jobs whose owner is unknown"
    return (
        f"{node}: implicated again within {span(window_s)} {who} ({_incidents_text(earlier, req)}): a job's output "
        f"is a claim: excluded for job {req.job_id}, suspicion recorded; a drain for everyone needs node-level "
        "evidence, a job of another user implicating it, or an operator's approval: waits for an operator"
    )


_Size = tuple[int | None, int]
"""A node's (GPUs, CPUs), as ``PlaceableNodes`` counts them."""


def _candidates(view: FleetView, req: IsolationRequest, out: set[str]) -> Counter[_Size]:
    """The placeable nodes of the job's partition that are not ``out``, counted by size."""
    if view.partition != req.partition:
        raise LookupError(f"the Fleet view counts partition {view.partition!r}, not the job's {req.partition!r}")
    sizes: Counter[_Size] = Counter({(p.gpus, p.cpus): p.count for p in view.placeable})
    for name in sorted(out):
        node = view.node(name)
        if node is not None and is_placeable(node) and in_partition(node, req.partition):
            sizes[(node.gpus, node.cpus)] -= 1
    return +sizes  # drops sizes no candidate has left


def _size_check(req: IsolationRequest, sizes: Iterable[_Size]) -> tuple[Callable[[_Size], bool], str, str]:
    """Whether a node of this size is big enough for one of the job's nodes, what that means (``with 2 GPUs, 8
    CPUs``), and how the check reads for people. A resource is checked only when the job's need and every
    candidate's size are known; with neither, the count is rough (placeable nodes, whatever their size), and the
    note says so."""
    gpus, cpus = req.gpus_per_node, req.cpus_per_node
    known = list(sizes)
    by_gpus = gpus is not None and all(g is not None for g, _ in known)
    by_cpus = cpus > 0 and all(c > 0 for _, c in known)
    wants = ([f"{gpus} GPUs" if gpus else "no GPUs"] if by_gpus else []) + ([f"{cpus} CPUs"] if by_cpus else [])
    unknown = [w for w, ok in (("GPUs", by_gpus), ("CPUs", by_cpus)) if not ok]

    def fits(size: _Size) -> bool:
        node_gpus, node_cpus = size
        return (not by_gpus or (node_gpus or 0) >= (gpus or 0)) and (not by_cpus or node_cpus >= cpus)

    if not wants:
        note = (
            "placement check was rough: placeable nodes counted whatever their size (the job's GPUs and CPUs per "
            "node, or the nodes' sizes, are unknown)"
        )
        return fits, "", note
    unchecked = f"; {' and '.join(unknown)} unknown, not checked" if unknown else ""
    return fits, f" with {', '.join(wants)}", f"placement checked per node: {', '.join(wants)} each{unchecked}"


def fit_exclusion(
    view: FleetView, req: IsolationRequest, unavailable: Sequence[str], suspects: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The suspects the job can do without, and the reasons: excluding more than its partition can spare would
    leave the job unplaceable (pending for ever), so the exclusion is dropped and the restart goes ahead without it.

    ``unavailable``: nodes out of this placement whatever happens (drained, waiting for an operator, already
    excluded). A job whose node count is unknown gets every exclusion (the safe side for one job's placement).
    A node counts only if it can hold one of the job's nodes (GPUs, CPUs: ``_size_check``). The view counts the
    partition's placeable nodes by size and names the request's nodes and exclusions (``view.view_input``), so
    the count is exact without the whole cluster.
    """
    if not suspects:
        return [], []
    if req.node_count <= 0:
        return list(suspects), []
    out = set(unavailable) | set(req.excluded_before) | set(req.owner_excluded)
    sizes = _candidates(view, req, out)
    fits, sized, note = _size_check(req, sizes)
    left = sum(count for size, count in sizes.items() if fits(size))
    for name in sorted(set(suspects) - out):
        node = view.node(name)
        if (
            node is not None
            and is_placeable(node)
            and in_partition(node, req.partition)
            and fits((node.gpus, node.cpus))
        ):
            left -= 1
    if left >= req.node_count:
        return list(suspects), [note]
    where = req.partition or "the cluster"
    return [], [
        f"{', '.join(suspects)}: not excluded: the job needs {req.node_count} nodes{sized} and {where} would keep "
        f"{left} placeable without {'it' if len(suspects) == 1 else 'them'}; restarted without this exclusion "
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
