"""A drain storm pages once: the first drain the breaker holds is announced, later ones (other jobs' requests)
join it while it is pending (``storm_announced``); drains held by a rule are announced each. Pure."""

from __future__ import annotations

from tests.unit.policy.test_fleet import ACT, OPS, POLICY, at, cluster, drains, request
from workflows.domain.fleet import Approval, ApprovalAnswer, ApprovalKind, ApprovalOutcome, FleetState
from workflows.domain.notify import NotificationKind
from workflows.policy.fleet import (
    answer_approval,
    approval_notification,
    decide_isolation,
    held_by_breaker,
    open_approval,
    storm_announced,
)

VIEW = cluster(4)  # cap max(1, min(4, 0.1 x 4)) = 1


def _held(state: FleetState, job: int, *nodes: str) -> tuple[FleetState, Approval]:
    """Job ``job``'s request, decided as the Fleet does, its held drains opened as an approval."""
    req = request(*nodes, job=job)
    verdict = decide_isolation(state, req, POLICY, VIEW, at(60))
    assert verdict.hold == nodes, verdict
    return open_approval(state, ApprovalKind.DRAIN, req, verdict.hold, verdict.reasons, OPS, at(60))


def test_the_first_held_drain_of_a_storm_is_announced_and_the_others_join_it() -> None:
    state = ACT.model_copy(update={"drains": drains((0, "n1"))})  # the storm's one drain: the breaker is open
    state, first = _held(state, 1, "n2")
    assert held_by_breaker(first) and storm_announced(state, first) is None  # nothing pending before: page
    state, second = _held(state, 2, "n3")
    assert storm_announced(state, second) == first  # one decision for the operator, not a second page
    page = approval_notification(first, "c", POLICY, "rebound/c/fleet")
    assert page.kind is NotificationKind.APPROVAL_NEEDED and "`rebound nodes` lists them" in page.text
    # Once the first is answered, the storm's next held drain pages again (a new decision is needed).
    state = answer_approval(state, ApprovalAnswer(approval_id=first.id, operator="alice", approve=False), at(90))
    assert storm_announced(state, second) is None
    state, third = _held(state, 3, "n4")
    assert storm_announced(state, third) == second


def test_a_drain_held_by_a_rule_is_always_announced() -> None:
    state = ACT.model_copy(update={"drains": drains((0, "n1"))})
    state, breaker = _held(state, 1, "n2")
    req = request("n3", job=2)
    state, ruled = open_approval(state, ApprovalKind.DRAIN, req, ["n3"], ["n3: one user's jobs only"], OPS, at(70))
    assert not held_by_breaker(ruled) and storm_announced(state, ruled) is None
    page = approval_notification(ruled, "c", POLICY, "rebound/c/fleet")
    assert "lists them" not in page.text
    restart = open_approval(state, ApprovalKind.RESTART, request(job=4), (), ["restart 6 of job 4"], OPS, at(80))[1]
    assert storm_announced(state, restart) is None
    assert breaker.outcome is ApprovalOutcome.PENDING
