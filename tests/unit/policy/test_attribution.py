from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.domain.findings import FindingKind
from workflows.domain.fleet import FleetPolicy
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import FailureClass, LogFinding
from workflows.domain.procs import NodeProcessesResult, RankProcess
from workflows.domain.ranks import RankMap, StepLayout
from workflows.policy.attribution import AttributionFacts, attribute, block_rank_layout, deciding_findings
from workflows.policy.rank_map import build_rank_map, step_layout_map

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
NODES = ("n1", "n2")
LAYOUT = block_rank_layout(NODES, 4)


def facts(**kw: object) -> AttributionFacts:
    base: dict[str, object] = {"job_nodes": NODES, "rank_nodes": LAYOUT}
    base.update(kw)
    return AttributionFacts(**base)  # type: ignore[arg-type]


def test_block_layout() -> None:
    assert LAYOUT == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    assert block_rank_layout(("a", "b"), 3) == {0: "a", 1: "a", 2: "b"}
    assert block_rank_layout((), 4) == {}


def test_xid_implicates_the_node_and_gpu() -> None:
    xid = GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=79)
    cuda = LogFinding(
        kind="cuda_error", rank=3, culprit=True, text="RuntimeError: CUDA error: unspecified launch failure"
    )
    a = attribute(facts(gpu_events=[xid], findings=[cuda]))
    assert (a.failure_class, a.cause, a.implicated_nodes, a.implicated_gpus) == (
        FailureClass.HARDWARE,
        "xid-79",
        ("n2",),
        ("n2:1",),
    )
    assert a.retryable and a.confidence >= 0.9


def test_gpu_event_on_another_node_is_ignored() -> None:
    other = GpuEvent(kind=GpuEventKind.XID, host="n4", index=0, xid=79)
    crash = LogFinding(kind="rank_exit", rank=1, culprit=True)
    assert attribute(facts(gpu_events=[other], findings=[crash])).implicated_nodes == ("n1",)


def test_dead_slurmd_beats_log_noise() -> None:
    victims = [LogFinding(kind="comm_error", rank=r) for r in (0, 1)]
    a = attribute(facts(unresponsive_nodes=["n2", "n4"], findings=victims))
    assert (a.cause, a.implicated_nodes, a.failure_class) == ("node-down", ("n2",), FailureClass.INFRASTRUCTURE)


def test_first_failing_rank_is_the_culprit_and_peers_are_victims() -> None:
    findings = [
        LogFinding(kind="comm_error", rank=0, at=T0 + timedelta(seconds=1), order=0),
        LogFinding(kind="rank_exit", rank=2, at=T0, order=1, culprit=True),
        LogFinding(kind="comm_error", rank=3, order=2),
    ]
    a = attribute(facts(findings=findings))
    assert (a.cause, a.implicated_nodes, a.implicated_ranks) == ("rank-crash", ("n2",), (2,))
    assert a.retryable and "only lost their peers" in a.explanation


def test_user_bug_on_two_nodes_is_not_retryable_and_implicates_no_node() -> None:
    findings = [
        LogFinding(
            kind="python_exception", rank=r, exception="ValueError", text="ValueError: shape mismatch", culprit=True
        )
        for r in range(4)
    ]
    a = attribute(facts(findings=findings))
    assert a.failure_class is FailureClass.USER
    assert not a.retryable and a.implicated_nodes == ()
    assert a.confidence >= 0.9 and "2 nodes" in a.explanation


def test_gloo_errors_alone_are_not_a_user_bug() -> None:
    victims = [LogFinding(kind="comm_error", rank=r) for r in (0, 1)]
    a = attribute(facts(findings=victims, ranks_logging=[0, 1]))
    assert a.failure_class is not FailureClass.USER
    # Ranks 2 and 3 went silent: their node is named, below the Fleet's approval threshold (never drained unasked).
    assert a.implicated_nodes == ("n2",) and a.confidence < FleetPolicy().approve_below_confidence
    assert a.cause == "ranks-vanished" and "n2" in a.explanation and a.confidence < 0.5


def test_ranks_stopped_from_outside_implicate_no_node_however_quiet() -> None:
    """A cancelled step (the lab saw one 10 s into a hang): every rank "Terminated", no peer lost a connection.
    The quiet node is not named: its ranks went quiet because they were told to stop."""
    stopped = [
        LogFinding(kind="terminated", rank=2, order=0, text="srun: error: n2: task 2: Terminated", node="n2"),
        LogFinding(kind="terminated", rank=0, order=1, text="srun: error: n1: task 0: Terminated", node="n1"),
    ]
    a = attribute(facts(findings=stopped, ranks_logging=[2, 3]))
    assert (a.cause, a.implicated_nodes) == ("unknown", ())
    # The same quiet node with a peer's connection error is rule 9's weak suspicion, as before.
    lost = LogFinding(kind="comm_error", rank=2, order=2, text="RuntimeError: Connection closed by peer")
    weak = attribute(facts(findings=[*stopped, lost], ranks_logging=[2, 3]))
    assert (weak.cause, weak.implicated_nodes) == ("ranks-vanished", ("n1",))


def test_nothing_conclusive_restarts_without_exclusion() -> None:
    a = attribute(facts())
    assert a.retryable and a.implicated_nodes == () and a.cause == "unknown"


def test_srun_node_failure_message() -> None:
    a = attribute(facts(node_failure_nodes=["n1"]))
    assert (a.cause, a.implicated_nodes) == ("node-failure", ("n1",))


def test_a_victims_exit_is_not_a_culprit() -> None:
    """Node crash: ranks 0-1 lose their peers and exit 1; ranks 2-3 (on the dead node) say nothing."""
    findings = [
        LogFinding(kind="comm_error", rank=0, order=0, text="RuntimeError: ... Connection closed by peer"),
        LogFinding(kind="comm_error", rank=1, order=1, text="RuntimeError: ... Connection closed by peer"),
        LogFinding(
            kind="rank_exit", rank=0, order=2, culprit=True, text="srun: error: n1: tasks 0-1: Exited with exit code 1"
        ),
        LogFinding(
            kind="rank_exit", rank=1, order=3, culprit=True, text="srun: error: n1: tasks 0-1: Exited with exit code 1"
        ),
    ]
    weak = attribute(facts(findings=findings, ranks_logging=[0, 1]))
    assert (weak.cause, weak.implicated_nodes) == ("ranks-vanished", ("n2",))
    assert weak.confidence < FleetPolicy().approve_below_confidence
    confirmed = attribute(facts(findings=findings, ranks_logging=[0, 1], unresponsive_nodes=["n2"]))
    assert (confirmed.cause, confirmed.implicated_nodes) == ("node-down", ("n2",))


def test_a_neighbour_that_only_looked_unresponsive_is_spared() -> None:
    victims = [LogFinding(kind="comm_error", rank=r) for r in (0, 1)]
    a = attribute(facts(findings=victims, ranks_logging=[0, 1], unresponsive_nodes=["n1", "n2"]))
    assert a.implicated_nodes == ("n2",)


def test_cuda_out_of_memory_is_the_programs_fault() -> None:
    oom = LogFinding(kind="cuda_error", rank=1, culprit=True, failure_class="user", exception="torch.OutOfMemoryError",
                     text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")  # fmt: skip
    a = attribute(facts(findings=[oom]))
    assert a.failure_class is FailureClass.USER and not a.retryable and a.implicated_nodes == ()


def test_deciding_findings_are_the_evidence_of_the_rule_that_decided() -> None:
    oom = LogFinding(kind=FindingKind.CUDA_ERROR, rank=1, culprit=True, failure_class=FailureClass.USER, order=1)
    exc = LogFinding(kind=FindingKind.PYTHON_EXCEPTION, rank=2, culprit=True, exception="KeyError", order=0)
    cuda = LogFinding(kind=FindingKind.CUDA_ERROR, rank=3, culprit=True, failure_class=FailureClass.HARDWARE, order=2)
    victim = LogFinding(kind=FindingKind.COMM_ERROR, rank=0, order=3)
    assert deciding_findings(facts(findings=[oom, exc, cuda, victim])) == (cuda,)
    assert deciding_findings(facts(findings=[oom, exc, victim])) == (exc, oom)
    assert deciding_findings(facts(findings=[victim])) == ()
    # A GPU agent's fault or a dead node decides before any log line does.
    xid = GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=79)
    assert deciding_findings(facts(findings=[cuda], gpu_events=[xid])) == ()
    assert deciding_findings(facts(findings=[cuda], unresponsive_nodes=["n1"])) == ()


def test_facts_from_findings_place_ranks_and_failed_nodes() -> None:
    lost = LogFinding(kind=FindingKind.NODE_FAILURE, node="n2", culprit=True)
    task = LogFinding(kind=FindingKind.RANK_EXIT, rank=0, node="n2", culprit=True, order=1)
    layout = step_layout_map(StepLayout(nodes=NODES, tasks_per_node=(2, 2)), tasks_are_ranks=True)
    built = AttributionFacts.from_findings(NODES, [lost, task], ranks=layout, ranks_logging={3, 1})
    assert built.rank_nodes == {0: "n2", 1: "n1", 2: "n2", 3: "n2"}  # rank 0's own line names its node
    assert (list(built.node_failure_nodes), list(built.ranks_logging)) == (["n2"], [1, 3])
    assert attribute(built).cause == "node-failure"


def _bus_error(rank: int | None, order: int) -> LogFinding:
    """A DataLoader worker's own report that SIGBUS stopped it (/dev/shm full): the shm_exhausted row."""
    return LogFinding(
        kind="killed",
        rank=rank,
        order=order,
        culprit=True,
        failure_class=FailureClass.INFRASTRUCTURE,
        text="ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory",
    )


def _exception(rank: int | None, order: int, name: str = "AttributeError") -> LogFinding:
    return LogFinding(
        kind="python_exception", rank=rank, order=order, culprit=True, exception=name, failure_class=FailureClass.USER
    )


def test_an_exception_after_its_ranks_bus_error_is_the_signals_symptom() -> None:
    # corpus bus_error-02 (DCPDN issue 58): the worker died of SIGBUS; PIL's internal AttributeError printed after it
    # is what the dying worker left, not the code's bug. The bus error decides, and a restart may help.
    bus, exc = _bus_error(None, 0), _exception(None, 1)
    a = attribute(facts(findings=[bus, exc]))
    assert (a.cause, a.retryable) == ("rank-killed", True)
    assert deciding_findings(facts(findings=[bus, exc])) == (bus,)
    segv = LogFinding(kind="segfault", rank=2, order=0, culprit=True, text="Fatal Python error: Segmentation fault")
    a = attribute(facts(findings=[segv, _exception(2, 1)]))
    assert (a.cause, a.retryable, a.implicated_nodes) == ("segfault", True, ("n2",))


def test_an_exception_before_the_signal_or_on_another_rank_stays_the_codes_bug() -> None:
    # Raised, then crashed on the way out: the exception is the cause and the signal its consequence.
    a = attribute(facts(findings=[_exception(1, 0, "KeyError"), _bus_error(1, 1)]))
    assert (a.cause, a.retryable) == ("user-bug", False)
    # Another rank's signal says nothing of this rank's exception.
    a = attribute(facts(findings=[_bus_error(0, 0), _exception(3, 1, "KeyError")]))
    assert (a.cause, a.retryable) == ("user-bug", False)
    # A rank the host OOM killer took for the job's own excess is no fatal signal of the node's.
    oom = LogFinding(kind="killed", rank=1, order=0, culprit=True, failure_class=FailureClass.USER)
    assert attribute(facts(findings=[oom, _exception(1, 1)])).cause == "user-bug"


# ----- rank -> node from facts (issue 11) -----------------------------------------------------------------------

_CUDA_RANK2 = LogFinding(kind=FindingKind.CUDA_ERROR, rank=2, culprit=True, failure_class=FailureClass.HARDWARE)


def _torchrun_map(nodes: tuple[str, ...], nproc: int) -> RankMap:
    answers = [
        NodeProcessesResult(
            node=n,
            observed_at=datetime(2026, 12, 2, tzinfo=UTC),
            processes=tuple(
                RankProcess(
                    pid=100 + r,
                    rank=r,
                    job_id=1,
                    node=n,
                    state="S",
                    rank_source="RANK",
                    local_rank=r - i * nproc,
                    local_world_size=nproc,
                    task=i,
                )
                for r in range(i * nproc, (i + 1) * nproc)
            ),
        )
        for i, n in enumerate(nodes)
    ]
    return build_rank_map(answers, job_nodes=nodes)


def test_without_facts_a_rank_implicates_no_node_and_says_why() -> None:
    a = attribute(AttributionFacts.from_findings(NODES, [_CUDA_RANK2]))
    assert a.implicated_nodes == () and a.implicated_ranks == (2,)
    assert "rank 2: node unknown (no process view, no step layout)" in a.explanation
    assert a.confidence < 0.5


def test_torchrun_rank_2_is_on_the_first_node_not_where_the_task_layout_puts_it() -> None:
    nodes = ("n1", "n2", "n3", "n4")
    ranks = _torchrun_map(nodes, 4)
    a = attribute(AttributionFacts.from_findings(nodes, [_CUDA_RANK2], ranks=ranks))
    assert a.implicated_nodes == ("n1",) and a.confidence == 0.8
    # srun's task layout alone (one torchrun per node) places tasks, never torchrun's ranks
    tasks_only = step_layout_map(StepLayout(nodes=nodes, tasks_per_node=(1, 1, 1, 1)), tasks_are_ranks=False)
    b = attribute(AttributionFacts.from_findings(nodes, [_CUDA_RANK2], ranks=tasks_only))
    assert b.implicated_nodes == () and "rank 2: node unknown (the ranks are a per-node launcher's" in b.explanation


def test_an_srun_label_places_its_line_by_the_task_not_as_a_rank() -> None:
    nodes = ("n1", "n2")
    ranks = _torchrun_map(nodes, 2)
    # "1: srun-labelled torchrun agent line": task 1 is n2's launcher; "rank 1" (on n1) must not be blamed
    agent = LogFinding(kind=FindingKind.RANK_EXIT, rank=1, task=1, rank_is_task=True, culprit=True)
    a = attribute(AttributionFacts.from_findings(nodes, [agent], ranks=ranks))
    assert a.implicated_nodes == ("n2",)
    assert a.implicated_ranks == () and a.explanation.startswith("Slurm task 1 failed first")


def test_cyclic_srun_per_rank_uses_the_cyclic_layout() -> None:
    nodes = ("n1", "n2", "n3", "n4")
    cyclic = step_layout_map(
        StepLayout(nodes=nodes, tasks_per_node=(4,) * 4, distribution="cyclic"), tasks_are_ranks=True
    )
    a = attribute(AttributionFacts.from_findings(nodes, [_CUDA_RANK2], ranks=cyclic))
    assert a.implicated_nodes == ("n3",)  # block would say n1
