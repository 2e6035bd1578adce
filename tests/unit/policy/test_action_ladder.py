"""The action ladder: one test per rung, and the rung attribution's verdicts end on (an action's strength follows
its evidence)."""

from __future__ import annotations

import pytest

from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import ActionRung, Attribution, EvidenceKind, FailureClass, LogFinding
from workflows.policy.action_ladder import choose_action, with_action
from workflows.policy.attribution import AttributionFacts, attribute, block_rank_layout

NODES = ("n1", "n2")


def verdict(basis: EvidenceKind, nodes: tuple[str, ...] = ("n2",)) -> Attribution:
    return Attribution(
        failure_class=FailureClass.UNKNOWN,
        cause="x",
        retryable=True,
        confidence=0.9,
        implicated_nodes=nodes,
        basis=basis,
    )


def facts(**kw: object) -> AttributionFacts:
    base: dict[str, object] = {"job_nodes": NODES, "rank_nodes": block_rank_layout(NODES, 4)}
    base.update(kw)
    return AttributionFacts(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("basis", [EvidenceKind.GPU_AGENT, EvidenceKind.NODE_DOWN, EvidenceKind.NODE_FAILURE])
def test_node_level_evidence_drains(basis: EvidenceKind) -> None:
    choice = choose_action(verdict(basis))
    assert (choice.rung, choice.basis) == (ActionRung.DRAIN, basis)
    assert choice.reason.startswith("drain n2: ")


@pytest.mark.parametrize(
    "basis",
    [
        EvidenceKind.JOB_HW_ERROR,
        EvidenceKind.RANK_EXIT,
        EvidenceKind.SILENCE,
        EvidenceKind.KERNEL_STUCK,
        EvidenceKind.SLOWNESS,
        EvidenceKind.NONE,
    ],
)
def test_the_jobs_own_word_only_excludes_and_records_a_suspicion(basis: EvidenceKind) -> None:
    choice = choose_action(verdict(basis))
    assert choice.rung is ActionRung.EXCLUDE
    assert "exclude n2 from this job's next placement and record a suspicion" in choice.reason
    assert "a drain needs node-level evidence" in choice.reason


def test_no_node_implicated_touches_nothing_whatever_the_evidence() -> None:
    for basis in EvidenceKind:
        assert choose_action(verdict(basis, nodes=())).rung is ActionRung.NOTHING


def test_confidence_does_not_buy_a_stronger_rung() -> None:
    """A confident verdict on the job's word is still the job's word."""
    strong = verdict(EvidenceKind.JOB_HW_ERROR).model_copy(update={"confidence": 1.0})
    assert choose_action(strong).rung is ActionRung.EXCLUDE


def test_with_action_records_the_rung_and_its_reason() -> None:
    a = with_action(verdict(EvidenceKind.RANK_EXIT))
    assert a.action is ActionRung.EXCLUDE
    assert "a rank died with no hardware evidence" in a.action_reason


# ----- where attribution's verdicts land ------------------------------------------------------------------------


def test_an_unexplained_rank_exit_excludes_its_node() -> None:
    a = attribute(
        facts(findings=[LogFinding(kind="rank_exit", rank=3, culprit=True, text="exited with exit code 137")])
    )
    assert (a.implicated_nodes, a.basis, a.action) == (("n2",), EvidenceKind.RANK_EXIT, ActionRung.EXCLUDE)


def test_a_sigkilled_rank_excludes_its_node() -> None:
    a = attribute(facts(findings=[LogFinding(kind="killed", rank=0, culprit=True, text="Killed")]))
    assert (a.implicated_nodes, a.action) == (("n1",), ActionRung.EXCLUDE)


def test_a_job_printed_ecc_error_alone_is_a_suspicion() -> None:
    cuda = LogFinding(
        kind="cuda_error", rank=3, culprit=True, text="RuntimeError: CUDA error: uncorrectable ECC error encountered"
    )
    a = attribute(facts(findings=[cuda]))
    assert (a.failure_class, a.implicated_nodes) == (FailureClass.HARDWARE, ("n2",))
    assert (a.basis, a.action) == (EvidenceKind.JOB_HW_ERROR, ActionRung.EXCLUDE)
    assert "not corroborated by the node agent" in a.action_reason


def test_a_job_printed_ecc_error_corroborated_by_the_node_agent_drains() -> None:
    cuda = LogFinding(
        kind="cuda_error", rank=3, culprit=True, text="RuntimeError: CUDA error: uncorrectable ECC error encountered"
    )
    dbe = GpuEvent(kind=GpuEventKind.XID, host="n2", index=1, xid=48)
    a = attribute(facts(findings=[cuda], gpu_events=[dbe]))
    assert (a.basis, a.action, a.implicated_nodes) == (EvidenceKind.GPU_AGENT, ActionRung.DRAIN, ("n2",))


def test_a_dead_slurmd_and_a_slurm_node_failure_drain() -> None:
    down = attribute(facts(unresponsive_nodes=["n2"]))
    failed = attribute(facts(node_failure_nodes=["n1"]))
    assert (down.basis, down.action) == (EvidenceKind.NODE_DOWN, ActionRung.DRAIN)
    assert (failed.basis, failed.action) == (EvidenceKind.NODE_FAILURE, ActionRung.DRAIN)


def test_the_codes_own_error_touches_no_node() -> None:
    bug = LogFinding(kind="python_exception", rank=1, exception="ValueError", culprit=True, text="ValueError: x")
    a = attribute(facts(findings=[bug]))
    assert (a.basis, a.action) == (EvidenceKind.CODE, ActionRung.NOTHING)
