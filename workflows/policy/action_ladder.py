"""The action ladder: how strong an action an attribution's evidence allows. Pure.

An action's strength follows its evidence. Three rungs, strongest first:

1. **drain** (``ActionRung.DRAIN``): node-level evidence, from outside the job: a node agent read the fault from
   the GPU (XID, lost GPU, double-bit ECC, NVML's throttle reasons), the scheduler lost the node's slurmd, or Slurm
   reported a node failure for the job. The Fleet is asked to drain the node for everyone (its own limits, the
   breaker and the approvals, still apply).
2. **exclude** (``ActionRung.EXCLUDE``): only the job's word against the node: a rank that died with no hardware
   evidence (a non-zero exit, a segfault, a SIGKILL), ranks that went silent, a rank stuck in the kernel during a
   hang, a straggler whose GPUs report nothing, and a CUDA hardware error the job printed itself (its own output:
   ``CUDA error: uncorrectable ECC error`` is what the framework says, not what the node agent read). The job is
   restarted without the node and the Fleet records a suspicion. A job's output is a claim (its owner controls
   what it prints and how many jobs there are): the same node implicated again within the Fleet's suspicion window
   by a job of another user escalates to a drain; again only by jobs of the same user, the drain waits for an
   operator (``workflows.policy.fleet.suspicion``).
3. **nothing** (``ActionRung.NOTHING``): no node is implicated (the code's own error, a hang nothing pins on a
   node, nothing conclusive): no node is touched.

A job-printed CUDA hardware error corroborated by the node agent (an XID or NVML error on that node in the same
attempt) never reaches this ladder as a job's word: attribution's first rule (a GPU fault read by the agent)
decides it, with node-level evidence.
"""

from __future__ import annotations

from workflows.domain.base import Frozen
from workflows.domain.incident import ActionRung, Attribution, EvidenceKind

__all__ = ["NODE_EVIDENCE", "ActionChoice", "choose_action", "describe_evidence", "with_action"]

#: Evidence about the node itself, from outside the job: enough to drain it.
NODE_EVIDENCE = frozenset(
    {EvidenceKind.GPU_AGENT, EvidenceKind.GPU_DCGM, EvidenceKind.NODE_DOWN, EvidenceKind.NODE_FAILURE}
)

_WHAT = {
    EvidenceKind.GPU_AGENT: "the node agent read a GPU fault",
    EvidenceKind.GPU_DCGM: "the node's DCGM exporter shows a failed GPU",
    EvidenceKind.NODE_DOWN: "the scheduler lost the node's slurmd",
    EvidenceKind.NODE_FAILURE: "Slurm reported a node failure",
    EvidenceKind.JOB_HW_ERROR: "a CUDA hardware error printed by the job itself, not corroborated by the node agent",
    EvidenceKind.RANK_EXIT: "a rank died with no hardware evidence",
    EvidenceKind.SILENCE: "ranks went silent and the scheduler did not confirm a dead node",
    EvidenceKind.KERNEL_STUCK: "a hung rank sat in uninterruptible sleep (the job's I/O or the node's driver)",
    EvidenceKind.SLOWNESS: "ranks ran slow while their GPUs reported no slowdown",
    EvidenceKind.CODE: "the training code's own error",
    EvidenceKind.NONE: "no evidence of a node's fault",
}


def describe_evidence(basis: EvidenceKind) -> str:
    """What a kind of evidence says about a node, for people (``a rank died with no hardware evidence``)."""
    return _WHAT[basis]


class ActionChoice(Frozen):
    """The rung chosen for one attribution, the kind of evidence it rests on, and why, for people."""

    rung: ActionRung
    basis: EvidenceKind
    reason: str


def choose_action(attribution: Attribution) -> ActionChoice:
    """The strongest action the attribution's evidence allows (the rungs are in the module docstring)."""
    basis = attribution.basis
    nodes = ", ".join(attribution.implicated_nodes)
    what = _WHAT[basis]
    if not attribution.implicated_nodes:
        return ActionChoice(rung=ActionRung.NOTHING, basis=basis, reason=f"no node is implicated ({what})")
    if basis in NODE_EVIDENCE:
        return ActionChoice(rung=ActionRung.DRAIN, basis=basis, reason=f"drain {nodes}: {what}")
    return ActionChoice(
        rung=ActionRung.EXCLUDE,
        basis=basis,
        reason=f"exclude {nodes} from this job's next placement and record a suspicion: {what}; a drain needs "
        "node-level evidence (the node agent's XID/NVML read, a dead slurmd, a Slurm node failure), the node "
        "implicated again by a job of another user, or an operator's approval",
    )


def with_action(attribution: Attribution) -> Attribution:
    """The attribution with its rung and the reason recorded (what the timeline and the audit show)."""
    choice = choose_action(attribution)
    return attribution.model_copy(update={"action": choice.rung, "action_reason": choice.reason})
