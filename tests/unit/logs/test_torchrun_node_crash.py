"""A node crash under torchrun, as the lab's slurm-%j.out recorded it: the survivors' launcher lines are victims'.

n2 died; n1's ranks lost their peers (gloo), n1's torch elastic agent then reported its children's exit code 1 and
srun reported n1's task exited 1. Read as a rank crash, the first of those lines blamed no node and the recovery went
on without waiting for the scheduler to see n2 dead (CI, stop 18). They are how victims end: the verdict rests on
n2's silence, weak enough that the attribution activity waits for the scheduler, which then names n2.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from activities.logs.attribution import LogEvidence
from activities.logs.tail import LogTail
from workflows.domain.fleet import FleetPolicy
from workflows.domain.procs import NodeProcessesResult, RankProcess
from workflows.domain.ranks import RankMap
from workflows.policy.attribution import AttributionFacts, attribute

CAPTURE = Path(__file__).parents[2] / "data" / "logs" / "lab-torchrun-node-crash.out"
NODES = ("n1", "n2")


def _torchrun_ranks() -> RankMap:
    """What the node agents saw before the crash: torchrun on each node, ranks 0-1 on n1 and 2-3 on n2."""
    from workflows.policy.rank_map import build_rank_map

    answers = [
        NodeProcessesResult(
            node=node,
            observed_at=datetime(2026, 12, 5, 9, 3, tzinfo=UTC),
            processes=tuple(
                RankProcess(
                    pid=100 + r,
                    rank=r,
                    job_id=9,
                    node=node,
                    state="S",
                    rank_source="RANK",
                    local_rank=r - 2 * i,
                    local_world_size=2,
                    task=i,
                )
                for r in range(2 * i, 2 * i + 2)
            ),  # fmt: skip
        )
        for i, node in enumerate(NODES)
    ]
    return build_rank_map(answers, job_nodes=NODES)


def _evidence(path: Path = CAPTURE) -> LogEvidence:
    lines, _ = LogTail([str(path)]).read_new({})
    evidence = LogEvidence()
    evidence.read(lines)
    return evidence


def _facts(evidence: LogEvidence, unresponsive: tuple[str, ...] = ()) -> AttributionFacts:
    return AttributionFacts.from_findings(
        NODES,
        evidence.findings,
        ranks=_torchrun_ranks(),
        ranks_logging=evidence.ranks_logging,
        unresponsive_nodes=list(unresponsive),
    )


def test_the_capture_holds_the_survivors_launcher_lines_as_culprit_rows() -> None:
    evidence = _evidence()
    culprits = [f for f in evidence.findings if f.culprit]
    assert any("failed (exitcode: 1)" in f.text for f in culprits)
    assert any("n1: task 0: Exited with exit code 1" in f.text for f in culprits)
    assert evidence.ranks_logging == {0, 1}


def test_before_the_scheduler_sees_n2_dead_the_verdict_is_n2s_silence_and_weak() -> None:
    a = attribute(_facts(_evidence()))
    assert (a.cause, a.implicated_nodes) == ("ranks-vanished", ("n2",))
    assert a.confidence < FleetPolicy().approve_below_confidence  # excluded, drained only with an operator's yes


def test_once_the_scheduler_sees_n2_dead_it_is_the_dead_node() -> None:
    a = attribute(_facts(_evidence(), unresponsive=("n2",)))
    assert (a.cause, a.implicated_nodes) == ("node-down", ("n2",))


def test_a_signal_in_the_launchers_summary_stays_a_culprit(tmp_path: Path) -> None:
    """torchrun's ``failed (exitcode: -9)`` (a rank SIGKILLed) is the launcher's own news, not a victim's end."""
    killed = tmp_path / "slurm-9.out"
    killed.write_text(CAPTURE.read_text().replace("failed (exitcode: 1)", "failed (exitcode: -9)"))
    a = attribute(_facts(_evidence(killed)))
    assert a.cause == "rank-crash" and "failed (exitcode: -9)" in a.evidence[0].text
