"""A hung job's evidence as one incident's (``evidence.summarise_hang_evidence``): pure, no Temporal."""

from __future__ import annotations

from datetime import UTC, datetime

from workflows.domain.procs import NodeProcessesResult, RankProcess, RankStack, StackDumpResult
from workflows.job_recovery.evidence import MAX_STACKS, summarise_hang_evidence

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _stack(rank: int, node: str, frame: str = "allreduce (dist.py:10)") -> RankStack:
    return RankStack(rank=rank, pid=100 + rank, node=node, text=f"Thread main\n  {frame}", main_frames=(frame,))


def _procs(node: str, *ranks: int) -> NodeProcessesResult:
    return NodeProcessesResult(
        node=node,
        observed_at=T0,
        processes=tuple(RankProcess(pid=100 + r, rank=r, job_id=7, node=node, state="S") for r in ranks),
    )


def test_stacks_and_processes_from_every_node_sorted_by_rank_with_the_odd_rank_named() -> None:
    found = [
        (_procs("n2", 3, 2), StackDumpResult(node="n2", stacks=(_stack(3, "n2", "load (io.py:5)"), _stack(2, "n2")))),
        (_procs("n1", 1, 0), StackDumpResult(node="n1", stacks=(_stack(1, "n1"), _stack(0, "n1")))),
    ]
    ev = summarise_hang_evidence(["n2", "n1"], found)
    assert [s.rank for s in ev.stacks] == [0, 1, 2, 3] and [p.rank for p in ev.processes] == [0, 1, 2, 3]
    assert ev.odd_ranks == (3,)
    assert ev.detail.startswith("4 stack(s), 4 process(es); odd rank(s): 3; ")


def test_an_agent_that_does_not_answer_is_noted_not_fatal() -> None:
    found = [(None, None), (_procs("n2", 0), StackDumpResult(node="n2", error="py-spy not found"))]
    ev = summarise_hang_evidence(["n1", "n2"], found)
    assert ev.stacks == () and len(ev.processes) == 1 and ev.odd_ranks == ()
    assert ev.detail == (
        "0 stack(s), 1 process(es); odd rank(s): none; no stacks; n1: agent did not answer; n2: py-spy not found"
    )


def test_the_evidence_kept_is_bounded() -> None:
    ranks = range(MAX_STACKS + 8)
    dump = StackDumpResult(node="n1", stacks=tuple(_stack(r, "n1") for r in ranks))
    ev = summarise_hang_evidence(["n1"], [(_procs("n1", *ranks), dump)])
    assert len(ev.stacks) == len(ev.processes) == MAX_STACKS
