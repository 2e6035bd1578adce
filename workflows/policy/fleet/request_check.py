"""A request checked against the Fleet's own fresh read of the scheduler, before anything is decided. Pure.

Anyone who can reach Temporal can signal ``request_isolation`` (docs/security.md): a forged request could name
any node, and the owner it claims decides whether a suspicion is "another user's". So the Fleet believes only
what the scheduler confirms:

* the job's owner is the scheduler's (a request's claimed ``user`` is replaced; an unlisted job's is unknown,
  which never counts as "another user");
* a node is implicated only if it is in the job's allocation, or the fresh read shows the node itself failing
  (not responding, down, failed): Slurm requeues a job whose node died and lists it pending with no nodes, and the
  node's own state is then the evidence. Every other node is dropped from the request, with the reason.

When the scheduler does not list the job at all, no node can be confirmed: nothing is implicated (do less).
"""

from __future__ import annotations

from workflows.domain.fleet import IsolationRequest
from workflows.domain.fleet_view import FleetView
from workflows.domain.slurm import NodeBaseState

__all__ = ["allocation_partial", "checked_request"]

_FAILING_STATES = frozenset({NodeBaseState.DOWN, NodeBaseState.ERROR})
_FAILING_FLAGS = frozenset({"FAIL", "FAILING", "NOT_RESPONDING"})


def _node_failing(view: FleetView, name: str) -> bool:
    node = view.node(name) if name in view.asked else None
    return node is not None and (node.state in _FAILING_STATES or bool(_FAILING_FLAGS & set(node.flags)))


def allocation_partial(view: FleetView, req: IsolationRequest) -> bool:
    """The job is completing and its listing lacks some of the request's nodes: wait for the whole list (a node
    that finished completing first drops out of the listing until the job has ended)."""
    alloc = view.job
    if alloc is None or not alloc.listed or not alloc.completing:
        return False
    return any(n not in alloc.nodes for n in req.nodes)


def checked_request(req: IsolationRequest, view: FleetView) -> tuple[IsolationRequest, tuple[str, ...]]:
    """The request as the scheduler confirms it, and one reason per thing changed (empty: nothing changed)."""
    alloc = view.job
    if alloc is None or alloc.job_id != req.job_id:
        return req, ()  # nothing asked of the job (a history from before the check): decided as it came
    notes: list[str] = []
    user = alloc.user if alloc.listed else ""
    if req.user and req.user != user:
        said = f"the scheduler lists {user}" if user else "the scheduler does not list the job"
        notes.append(f"the request names user {req.user!r}; {said}: the scheduler's word is used")
    allocation = set(alloc.nodes)
    kept = tuple(n for n in req.nodes if n in allocation or _node_failing(view, n))
    dropped = [n for n in req.nodes if n not in kept]
    if dropped:
        where = (
            f"job {req.job_id}'s allocation ({', '.join(alloc.nodes) or 'none'})"
            if alloc.listed
            else f"any allocation (the scheduler does not list job {req.job_id})"
        )
        notes.append(
            f"{', '.join(dropped)} not in {where} and not failing in the scheduler's fresh read: not implicated "
            "(a stale or forged request)"
        )
    if not notes:
        return req, ()
    return req.model_copy(update={"user": user, "nodes": kept}), tuple(notes)
