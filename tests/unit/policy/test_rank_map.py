"""Rank -> node from facts, per launcher (workflows.policy.rank_map): what the node agents saw, srun's step layout
when the ranks are srun tasks, and the log evidence; unknown otherwise, with the reason."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workflows.domain.findings import FindingKind
from workflows.domain.incident import LogFinding
from workflows.domain.procs import NodeProcessesResult, RankProcess
from workflows.domain.ranks import MAX_RANK_SPANS, Launcher, RankMap, RankSource, StepLayout
from workflows.policy.rank_map import build_rank_map, layout_tasks, merge_maps, with_evidence

AT = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
JOB = 77


def _proc(node: str, rank: int, source: str, **kw: int) -> RankProcess:
    return RankProcess(pid=1000 + rank, rank=rank, job_id=JOB, node=node, state="S", rank_source=source, **kw)


def _answer(node: str, *procs: RankProcess, layout: StepLayout | None = None) -> NodeProcessesResult:
    return NodeProcessesResult(node=node, observed_at=AT, processes=procs, step_layout=layout)


def _torchrun(node: str, task: int, nproc: int, nnodes: int, alive: range | None = None) -> NodeProcessesResult:
    """torchrun under srun --ntasks-per-node=1: node ``task``'s workers have RANK, LOCAL_RANK, LOCAL_WORLD_SIZE,
    WORLD_SIZE and their launcher's SLURM_PROCID (the task)."""
    ranks = alive if alive is not None else range(task * nproc, (task + 1) * nproc)
    procs = [
        _proc(
            node,
            r,
            "RANK",
            local_rank=r - task * nproc,
            task=task,
            local_world_size=nproc,
            world_size=nproc * nnodes,
        )
        for r in ranks
    ]
    return _answer(node, *procs)


def _srun(
    nodes: tuple[str, ...], per_node: int, distribution: str, seen: dict[str, list[int]]
) -> list[NodeProcessesResult | None]:
    """srun one task per rank: each node's agent sees the ranks in ``seen`` and srun's layout in their environment."""
    layout = StepLayout(nodes=nodes, tasks_per_node=(per_node,) * len(nodes), distribution=distribution)
    world = per_node * len(nodes)
    return [
        _answer(n, *(_proc(n, r, "SLURM_PROCID", task=r, world_size=world) for r in seen.get(n, [])), layout=layout)
        for n in nodes
    ]


def test_torchrun_under_srun_places_rank_2_on_the_first_node_not_the_third() -> None:
    # 4 nodes x 4 local ranks: the case (the task layout would put "rank 2" on n3)
    answers = [_torchrun(f"n{i + 1}", i, 4, 4) for i in range(4)]
    m = build_rank_map(answers, job_nodes=("n1", "n2", "n3", "n4"), observed_at=AT)
    assert m.launcher is Launcher.PER_NODE and not m.tasks_are_ranks
    assert m.node_of_rank(2) == "n1" and m.node_of_rank(13) == "n4"
    assert m.node_of_task(2) == "n3"  # an srun label 2 is the third node's launcher
    assert m.world_size == 16
    assert len(m.ranks) == 4  # one span per node


def test_torchrun_a_rank_that_died_before_the_look_is_placed_by_its_siblings() -> None:
    answers = [_torchrun("n1", 0, 2, 2), _torchrun("n2", 1, 2, 2, alive=range(3, 4))]  # rank 2 already gone
    m = build_rank_map(answers, job_nodes=("n1", "n2"))
    assert m.node_of_rank(2) == "n2"
    assert m.source_of_rank(2) is RankSource.LAUNCHER_GROUP
    assert m.source_of_rank(3) is RankSource.PROCESS


@pytest.mark.parametrize(
    ("distribution", "rank", "node"),
    [("block", 5, "n2"), ("", 5, "n2"), ("cyclic", 5, "n2"), ("cyclic", 6, "n3"), ("cyclic:block", 7, "n4")],
)
def test_srun_per_rank_layout_places_ranks_not_seen(distribution: str, rank: int, node: str) -> None:
    nodes = ("n1", "n2", "n3", "n4")
    m = build_rank_map(_srun(nodes, 3, distribution, {"n1": [0]}), job_nodes=nodes)
    assert m.launcher is Launcher.SRUN and m.tasks_are_ranks
    assert m.node_of_rank(rank) == node
    assert m.node_of_task(rank) == node
    assert m.source_of_rank(rank) is RankSource.STEP_LAYOUT


def test_cyclic_seen_processes_beat_nothing_and_agree_with_the_layout() -> None:
    nodes = ("n1", "n2", "n3", "n4")
    m = build_rank_map(_srun(nodes, 3, "cyclic", {"n3": [2, 6, 10]}), job_nodes=nodes)
    assert [m.node_of_rank(r) for r in (2, 6, 10)] == ["n3"] * 3
    assert m.source_of_rank(6) is RankSource.PROCESS
    assert m.node_of_rank(1) == "n2"  # from the cyclic layout


def test_arbitrary_distribution_places_only_the_ranks_seen() -> None:
    nodes = ("n1", "n2")
    m = build_rank_map(_srun(nodes, 2, "arbitrary", {"n2": [0]}), job_nodes=nodes)
    assert m.node_of_rank(0) == "n2"
    assert m.node_of_rank(1) is None
    assert any("arbitrary" in n for n in m.notes)


def test_lightning_slurm_environment_is_srun_per_rank() -> None:
    # Lightning under srun: SLURM_PROCID is the global rank, no RANK in the environment
    nodes = ("a", "b")
    answers = [
        _answer("a", _proc("a", 0, "SLURM_PROCID", task=0, local_rank=0), _proc("a", 1, "SLURM_PROCID", task=1)),
        _answer("b", _proc("b", 2, "SLURM_PROCID", task=2), _proc("b", 3, "SLURM_PROCID", task=3)),
    ]
    m = build_rank_map(answers, job_nodes=nodes)
    assert m.launcher is Launcher.SRUN and m.node_of_rank(3) == "b" and m.node_of_task(1) == "a"


def test_accelerate_or_deepspeed_launcher_without_slurm_tasks() -> None:
    # accelerate launch / deepspeed (hostfile, ssh): RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, no SLURM_PROCID
    answers = [
        _answer("h1", _proc("h1", 0, "RANK", local_rank=0, local_world_size=2)),
        _answer("h2", _proc("h2", 3, "RANK", local_rank=1, local_world_size=2)),
    ]
    m = build_rank_map(answers, job_nodes=("h1", "h2"))
    assert m.launcher is Launcher.PER_NODE
    assert [m.node_of_rank(r) for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert m.tasks == ()


def test_a_rank_claimed_by_two_nodes_is_placed_nowhere() -> None:
    answers = [_answer("n1", _proc("n1", 0, "RANK")), _answer("n2", _proc("n2", 0, "RANK"))]
    m = build_rank_map(answers, job_nodes=("n1", "n2"))
    assert m.node_of_rank(0) is None
    assert any("claimed" in n for n in m.notes)


def test_nothing_known_says_why() -> None:
    assert build_rank_map([None, None], job_nodes=("n1", "n2")).unknown.startswith("no node agent saw")
    m = build_rank_map([_torchrun("n1", 0, 2, 2), None], job_nodes=("n1", "n2"))
    assert m.node_of_rank(3) is None and "no answer from n2" in m.unknown
    assert RankMap().node_of_rank(0) is None


def test_an_earlier_look_keeps_ranks_that_died_since() -> None:
    early = build_rank_map([_torchrun("n1", 0, 2, 2), _torchrun("n2", 1, 2, 2)], job_nodes=("n1", "n2"))
    late = build_rank_map([_torchrun("n1", 0, 2, 2), _answer("n2")], job_nodes=("n1", "n2"))
    assert late.node_of_rank(2) is None
    merged = merge_maps(late, early)
    assert merged.node_of_rank(2) == "n2" and merged.node_of_rank(0) == "n1"
    assert merge_maps(RankMap(), early) == early


def test_evidence_places_what_the_facts_do_not_and_never_moves_a_fact() -> None:
    base = build_rank_map([_torchrun("n1", 0, 2, 2)], job_nodes=("n1", "n2"))
    findings = [
        LogFinding(kind=FindingKind.RANK_EXIT, rank=3, node="n2"),
        LogFinding(kind=FindingKind.RANK_EXIT, rank=1, node="n2"),  # contradicts a process seen: ignored
        LogFinding(kind=FindingKind.RANK_EXIT, rank=1, task=1, rank_is_task=True, node="n2"),
        LogFinding(kind=FindingKind.RANK_EXIT, rank=9, node="elsewhere"),
    ]
    m = with_evidence(base, findings, ("n1", "n2"))
    assert m.node_of_rank(3) == "n2" and m.source_of_rank(3) is RankSource.EVIDENCE
    assert m.node_of_rank(1) == "n1"
    assert m.node_of_task(1) == "n2"
    assert m.node_of_rank(9) is None


def test_layout_tasks() -> None:
    assert layout_tasks(StepLayout(nodes=("a", "b"), tasks_per_node=(2, 1), distribution="cyclic")) == {
        0: "a",
        1: "b",
        2: "a",
    }
    assert layout_tasks(StepLayout(nodes=("a", "b"), tasks_per_node=(2, 1))) == {0: "a", 1: "a", 2: "b"}
    assert layout_tasks(StepLayout(nodes=("a",), tasks_per_node=(2,), distribution="plane=2")) is None


def test_the_map_is_bounded() -> None:
    nodes = tuple(f"n{i}" for i in range(2))
    procs = [_proc(nodes[r % 2], r, "SLURM_PROCID") for r in range(2 * MAX_RANK_SPANS + 10)]
    m = build_rank_map([_answer(n, *(p for p in procs if p.node == n)) for n in nodes], job_nodes=nodes)
    assert len(m.ranks) == MAX_RANK_SPANS
    assert any("not kept" in n for n in m.notes)
