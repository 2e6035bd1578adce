"""The scenarios of ``rebound bench recovery``, their ground truth and the fault's target (pure).

Scenarios and their ground truth (the node to blame, and whether a restart is the right answer):

==============  =====================================================  ==========================  =======
scenario        fault                                                  blame                       restart
==============  =====================================================  ==========================  =======
``rank-crash``  ``crash`` (exit 13) of the first rank on the 2nd node  that rank's node            yes
``node-crash``  ``node-crash`` (kill) of the job's 2nd node            that node                   yes
``xid``         ``gpu-fault`` XID 79 on that rank's GPU                that node                   yes
``user-bug``    ``user-bug`` on every rank                             no node (the user's code)   no
==============  =====================================================  ==========================  =======

Only node-level evidence drains (``node-crash``: the scheduler lost the slurmd; ``xid``: the node agent read it).
A rank that exits with no hardware evidence is the job's word: its node is excluded from the job's next placement
and drained for nobody, so a drain in ``rank-crash`` is a false action.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, get_args

from workflows.domain.base import Frozen

if TYPE_CHECKING:
    from deploy.demo.common import RankInfo
    from deploy.demo.injections import InjectionRecord

Scenario = Literal["rank-crash", "node-crash", "xid", "user-bug"]
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
XID = 79


class GroundTruth(Frozen):
    """What a perfect Rebound does about an injected fault."""

    node: str | None
    """The node to blame (excluded from the job's next placement; drained only on node-level evidence); None: the
    user's code, no node is at fault."""
    restart: bool
    """Whether restarting the job is the right response."""
    drain: bool = True
    """Whether ``node`` may be drained for everyone (node-level evidence); False: excluded for the job only."""


def ground_truth(scenario: Scenario, record: InjectionRecord) -> GroundTruth:
    """The truth of one injection.

    Raises:
        ValueError: a node fault whose record names no node.
    """
    if scenario == "user-bug":
        return GroundTruth(node=None, restart=False)
    if record.node is None:
        raise ValueError(f"{scenario} injection {record.id} recorded no node")
    return GroundTruth(node=record.node, restart=True, drain=scenario != "rank-crash")


def pick_target(ranks: Sequence[RankInfo]) -> RankInfo:
    """The lowest rank on a node other than rank 0's (the batch host): rank 2 of a 2x2 job.

    Raises:
        ValueError: every rank runs on rank 0's node, or there is no rank 0.
    """
    by_rank = sorted(ranks, key=lambda r: r.rank)
    if not by_rank or by_rank[0].rank != 0:
        raise ValueError("no rank 0 among the live ranks")
    other = [r for r in by_rank if r.node != by_rank[0].node]
    if not other:
        raise ValueError(f"every rank runs on {by_rank[0].node}: the job needs two nodes")
    return other[0]


def parse_scenarios(text: str | None) -> tuple[Scenario, ...]:
    """``"xid,user-bug"`` -> those scenarios in that order; None or ``"all"``: every scenario.

    Raises:
        ValueError: an unknown name.
    """
    if text is None or text.strip().lower() == "all":
        return SCENARIOS
    out: list[Scenario] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = next((s for s in SCENARIOS if s == part), None)
        if match is None:
            raise ValueError(f"unknown scenario {part!r}: choose from {', '.join(SCENARIOS)}")
        if match not in out:
            out.append(match)
    if not out:
        raise ValueError("no scenario given")
    return tuple(out)
