"""Attribution of failures that never exit: hangs and stragglers. Pure.

A hang is blamed on a rank, not on a node, unless something beyond the silence points at the node: the rank
whose progress stopped first and the rank whose stack differs from its peers' are named (they agree in the
common case of one rank stuck in its own code while the others wait in a collective), and the job is restarted
without excluding anyone. Silence and an odd stack prove a rank is stuck, not that its hardware is bad, and a
drain on that evidence would turn every user-code deadlock into lost capacity. A rank stuck in uninterruptible
sleep (``D``: the kernel, a driver or a file system holds it) does implicate its node. GPU faults and dead nodes
are handled before this by the general rules (``workflows.policy.attribution``).

A straggler is reported with its node and its slowdown; GPU clock-event reasons that say the hardware slowed
itself down (thermal or power brake, hardware slowdown) make it a hardware finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workflows.domain.findings import Cause
from workflows.domain.hang import HangVerdict
from workflows.domain.incident import Attribution, Evidence, EvidenceKind, EvidenceSource, FailureClass
from workflows.domain.procs import RankProcess
from workflows.domain.straggler import StragglerVerdict
from workflows.policy.action_ladder import with_action

__all__ = ["SLOWDOWN_REASON_BITS", "attribute_hang", "attribute_straggler", "slowdown_reasons"]

#: The hang verdict's confidence when every rank stopped at the same step at the same time.
_TIED_CONFIDENCE = 0.1

#: NVML clocks-event (throttle) reason bits that mean the GPU slowed itself down, by name.
SLOWDOWN_REASON_BITS: Mapping[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


def slowdown_reasons(mask: int | None) -> tuple[str, ...]:
    """The names of the slowdown bits set in an NVML clocks-event-reasons mask (idle, app clocks ignored)."""
    if not mask:
        return ()
    return tuple(name for bit, name in SLOWDOWN_REASON_BITS.items() if mask & bit)


def attribute_hang(
    verdict: HangVerdict, odd_ranks: Sequence[int], processes: Sequence[RankProcess], stack_summary: str = ""
) -> Attribution:
    """Who is to blame for a hang (see the module docstring)."""
    node_of = {r.rank: r.node for r in verdict.ranks if r.node}
    node_of.update({p.rank: p.node for p in processes if p.node})
    by_logs = [verdict.culprit_rank] if verdict.culprit_rank is not None else []
    # Ranks of a synchronous job stop at the same step together: then the logs cannot tell (the verdict says so
    # with its lowest confidence), and a stack that differs from its peers' is the better witness.
    tied = verdict.confidence <= _TIED_CONFIDENCE
    suspects = list(dict.fromkeys([*odd_ranks, *by_logs] if tied and odd_ranks else [*by_logs, *odd_ranks]))
    evidence = [Evidence(source=EvidenceSource.LOGS, text=verdict.summary or "no rank made progress")]
    if stack_summary:
        evidence.append(Evidence(source=EvidenceSource.LOGS, text=f"stacks: {stack_summary}"[:500]))
    stuck_in_kernel = [p for p in processes if p.state == "D"]
    for p in stuck_in_kernel[:4]:
        evidence.append(
            Evidence(
                source=EvidenceSource.LOGS,
                text=f"rank {p.rank} pid {p.pid} in uninterruptible sleep (D) wchan={p.wchan or '-'}",
                node=p.node,
                rank=p.rank,
            )
        )
    agree = verdict.culprit_rank is not None and list(odd_ranks) == [verdict.culprit_rank]
    # One rank's stack standing out from all its peers' is good evidence even when the logs cannot tell.
    single_odd = tied and len(odd_ranks) == 1
    confidence = 0.6 if single_odd else min(0.9, verdict.confidence + (0.1 if agree else 0.0))
    d_nodes = sorted({p.node for p in stuck_in_kernel if p.node})
    # One node's ranks stuck in the kernel while other nodes' are not: the node (driver, file system) is suspect.
    all_nodes = {p.node for p in processes if p.node}
    if d_nodes and len(d_nodes) < max(2, len(all_nodes)):
        return Attribution(
            failure_class=FailureClass.INFRASTRUCTURE,
            cause=Cause.HANG_IN_KERNEL,
            retryable=True,
            confidence=0.6,
            implicated_nodes=tuple(d_nodes),
            implicated_ranks=tuple(p.rank for p in stuck_in_kernel),
            explanation=f"the job hung with rank(s) {', '.join(str(p.rank) for p in stuck_in_kernel)} in "
            f"uninterruptible sleep on {', '.join(d_nodes)}",
            evidence=tuple(evidence),
            basis=EvidenceKind.KERNEL_STUCK,
        )
    who = ", ".join(f"rank {r}" + (f" on {node_of[r]}" if r in node_of else "") for r in suspects) or "no rank"
    why = []
    if verdict.culprit_rank is not None and not tied:
        why.append(f"rank {verdict.culprit_rank} stopped first")
    elif tied:
        why.append("all ranks stopped at the same step")
    if odd_ranks:
        why.append(f"stack of rank(s) {', '.join(map(str, odd_ranks))} differs from its peers'")
    return Attribution(
        failure_class=FailureClass.UNKNOWN,
        cause=Cause.HANG,
        retryable=True,
        confidence=round(confidence, 2),
        implicated_ranks=tuple(suspects),
        explanation=f"no rank made progress for {verdict.window_s:.0f}s; suspect {who}"
        + (f" ({'; '.join(why)})" if why else "")
        + "; nothing implicates a node, so none is drained or excluded",
        evidence=tuple(evidence),
    )


def attribute_straggler(verdict: StragglerVerdict, throttled: Mapping[str, Sequence[str]]) -> Attribution:
    """The slow ranks' nodes, hardware when their GPUs report slowing themselves down.

    Args:
        verdict: The straggler verdict (at least one flagged rank).
        throttled: Per straggling node, evidence lines of GPUs whose clock-event reasons say they slowed down.
    """
    nodes = tuple(n.node for n in verdict.nodes if n.node)
    ranks = tuple(r.rank for r in verdict.stragglers)
    worst = max((r.slowdown for r in verdict.stragglers), default=1.0)
    evidence = [
        Evidence(source=EvidenceSource.LOGS, text=r.evidence, node=r.node, rank=r.rank) for r in verdict.stragglers[:6]
    ]
    hot = {n: lines for n, lines in throttled.items() if lines and n in nodes}
    for node, lines in hot.items():
        evidence += [Evidence(source=EvidenceSource.GPU, text=line, node=node) for line in lines[:3]]
    metric = verdict.metric.value.replace("_", " ") if verdict.metric else "step time"
    return with_action(
        Attribution(
            failure_class=FailureClass.HARDWARE if hot else FailureClass.UNKNOWN,
            cause=Cause.STRAGGLER_GPU_THROTTLED if hot else Cause.STRAGGLER,
            retryable=True,
            confidence=0.85 if hot else 0.7,
            implicated_nodes=nodes,
            implicated_ranks=ranks,
            explanation=f"rank(s) {', '.join(map(str, ranks))} on {', '.join(nodes) or 'an unknown node'} are "
            f"{worst:.2f}x slower than their peers' {metric}"
            + (f"; GPUs of {', '.join(hot)} report slowing themselves down" if hot else ""),
            evidence=tuple(evidence),
            basis=EvidenceKind.GPU_AGENT if hot else EvidenceKind.SLOWNESS,
        )
    )
