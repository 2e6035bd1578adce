"""Attribution: from the evidence of one failure to the implicated resources and a failure class. Pure.

Rules, strongest first (the first that applies decides; the rest of the evidence is kept for the record):

1. A GPU fault (XID, lost GPU, double-bit ECC) on one of the job's nodes, or a GPU the merged NVML + DCGM
   verdict of a job node fails: hardware; that node and GPU (``workflows.policy.attribution_gpu``).
2. One of the job's nodes is DOWN or NOT_RESPONDING (its slurmd is dead): infrastructure; that node.
3. Slurm reports a node failure for the job (``Node failure on nX``, NODE_FAIL): infrastructure; that node.
4. A CUDA-style error in a rank's output: hardware; the node of that rank (below).
5. The checkpoint the job resumes from could not be read (a truncated or torn file, a missing shard or
   ``.metadata``): infrastructure, the checkpoint's fault and neither the code's nor a node's; no node is
   implicated. Not retryable as it stands (a restart loads the same checkpoint); the recovery policy may make it
   retryable when an older complete checkpoint exists. Whatever the code raised after the failed load is its
   consequence, so this rule comes before rule 6.
6. A Python exception from training code (not a communication or CUDA error), a CUDA out-of-memory or device
   assert, or a rank killed for its own excess memory: the user's own bug. No node is implicated and no restart
   can help. The same exception on ranks of different nodes makes it certain. An exception its rank prints after
   a fatal signal (a bus error, a segfault, an abort, a DataLoader worker's SIGBUS) is that signal's symptom, not
   the code's bug: rule 7 decides on the signal.
7. A rank that died on its own (non-zero exit, segfault, killed): the node of the first failing rank, with
   modest confidence. Peers that only report a broken connection are victims, never culprits.
8. A hang (no rank made progress for the job's window): the rank that stopped first and the ranks whose stacks
   differ are suspects; no node is implicated unless a rank is stuck in the kernel (``workflows.policy.implicit``).
9. Only victims, among them peers that lost their connections, and ranks that went silent without a word: the
   node of the silent ranks, low confidence (below the Fleet's approval threshold: excluded from the job's next
   placement, drained only with an operator's yes). Victims that were only stopped (srun's "Terminated" on every
   rank, a cancelled step) say nothing about a node: rule 10.
10. Nothing conclusive: unknown; restart without excluding anyone.

Each verdict names the kind of evidence it rests on (``Attribution.basis``), and ``attribute`` ends with the
action ladder (``workflows.policy.action_ladder``): node-level evidence (rules 1-3) may drain; the job's own word
(rules 4, 7, 8, 9) only excludes the node from the job's next placement and records a suspicion.

The node of a rank comes from facts only (``workflows.domain.ranks.RankMap``, built by
``workflows.policy.rank_map``): the line's own node (``%N``, a host prefix, srun's ``n3: task 6``), else the node
of the Slurm task that wrote it (an srun label), else the node of its rank. A rank the facts do not place
implicates no node: the attribution says ``rank R: node unknown (<why>)`` and the restart excludes nothing. srun's
block layout is used only where the facts say the ranks are srun tasks laid out block-wise.

One engine for every caller: the ``attribute_failure`` activity, ``rebound bench attribution`` and
``rebound diagnose`` build their facts with ``AttributionFacts.from_findings`` and call ``attribute``;
``deciding_findings`` names the log findings rules 3-7 rest on (``rebound diagnose`` names its root cause among them).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import NamedTuple

from workflows.domain.findings import Cause, FindingKind
from workflows.domain.incident import Attribution, Evidence, EvidenceKind, EvidenceSource, FailureClass, LogFinding
from workflows.domain.ranks import Launcher
from workflows.policy.action_ladder import with_action
from workflows.policy.attribution_facts import AttributionFacts, block_rank_layout
from workflows.policy.attribution_gpu import gpu_attribution, has_gpu_fault
from workflows.policy.implicit import attribute_hang

__all__ = [
    "AttributionFacts",
    "EXIT_KINDS",
    "GPU_KINDS",
    "USER_KINDS",
    "attribute",
    "block_rank_layout",
    "deciding_findings",
]

#: Finding kinds that point at the GPU and at the code.
GPU_KINDS = frozenset({FindingKind.CUDA_ERROR, FindingKind.XID})
USER_KINDS = frozenset({FindingKind.PYTHON_EXCEPTION})
#: Findings that only say a rank ended: what killed it decides whether it is a culprit. An abort (SIGABRT) after
#: the rank's own communication error or watchdog timeout is how NCCL's watchdog ends a victim.
EXIT_KINDS = frozenset({FindingKind.RANK_EXIT, FindingKind.KILLED, FindingKind.TERMINATED, FindingKind.FATAL_SIGNAL})
#: The cause named after the kind of the first culprit finding (rule 7); any other kind is a ``rank-crash``.
_EXIT_CAUSES = {
    FindingKind.SEGFAULT: Cause.SEGFAULT,
    FindingKind.KILLED: Cause.RANK_KILLED,
    FindingKind.FATAL_SIGNAL: Cause.FATAL_SIGNAL,
}


def attribute(facts: AttributionFacts) -> Attribution:
    """Apply the rules above, then the action ladder; see the module docstring."""
    return with_action(_verdict(facts))


def _verdict(facts: AttributionFacts) -> Attribution:
    gpu = gpu_attribution(facts)
    if gpu is not None:
        return gpu
    down = _dead_nodes(facts)
    if down:
        return Attribution(
            failure_class=FailureClass.INFRASTRUCTURE,
            cause=Cause.NODE_DOWN,
            retryable=True,
            confidence=0.9,
            implicated_nodes=tuple(down),
            explanation=f"slurmd on {', '.join(down)} stopped responding while the job ran there",
            evidence=tuple(_node_evidence(n) for n in down),
            basis=EvidenceKind.NODE_DOWN,
        )
    ordered = sorted(facts.findings, key=_first_key)
    rule = _log_rule(facts, ordered)
    if rule is not None:
        return _from_log_rule(rule, facts, ordered)
    if facts.hang is not None:
        return attribute_hang(facts.hang, facts.odd_ranks, facts.processes, facts.stack_summary)
    victims = [f for f in ordered if not f.culprit]
    # Silence implicates a node only when peers said they lost it: ranks that were all stopped from outside (a
    # step cancelled: every rank "Terminated", no connection error) went quiet because they were told to.
    if any(f.kind == FindingKind.COMM_ERROR for f in victims):
        silent = _silent_nodes(facts)
        if silent:
            # Silence is weak evidence: the activity first waits for the scheduler to confirm a dead node (then
            # rule 2 applies). Unconfirmed, the silent node is named with a confidence below the Fleet's approval
            # threshold, so it is kept out of the job's next placement but drained only if an operator agrees.
            return Attribution(
                failure_class=FailureClass.UNKNOWN,
                cause=Cause.RANKS_VANISHED,
                retryable=True,
                confidence=0.4,
                implicated_nodes=silent,
                explanation=f"peers lost their connections while every rank on {', '.join(silent)} went silent; "
                "the scheduler did not confirm a dead node",
                evidence=_evidence(victims[:3]),
                basis=EvidenceKind.SILENCE,
            )
    return Attribution(
        failure_class=FailureClass.UNKNOWN,
        cause=Cause.UNKNOWN,
        retryable=True,
        confidence=0.2,
        explanation="the job failed without evidence that points at a node or at the code",
        evidence=_evidence(ordered[:3]),
    )


def deciding_findings(facts: AttributionFacts) -> tuple[LogFinding, ...]:
    """The log findings ``attribute`` rests its verdict on: those of the first of rules 3-7 that applies (a node
    failure, the CUDA errors, the unreadable checkpoint, the code's exceptions, the ranks that died on their own),
    the deciding one first.

    Empty when a GPU fault or a dead node decides (rules 1-2), or when no log finding does (a hang, victims alone,
    nothing). ``rebound diagnose`` names its root cause among these, so it never contradicts a live recovery.
    """
    if has_gpu_fault(facts) or _dead_nodes(facts):
        return ()
    rule = _log_rule(facts, sorted(facts.findings, key=_first_key))
    return tuple(rule.findings) if rule is not None else ()


class _Rule(Enum):
    NODE_FAILURE = 3
    CUDA = 4
    CHECKPOINT = 5
    USER = 6
    CULPRIT = 7


class _LogRule(NamedTuple):
    """The first of rules 3-7 that applies, and its findings (the deciding one first)."""

    rule: _Rule
    findings: list[LogFinding]


def _log_rule(facts: AttributionFacts, ordered: list[LogFinding]) -> _LogRule | None:
    if set(facts.node_failure_nodes) & set(facts.job_nodes):
        return _LogRule(_Rule.NODE_FAILURE, [f for f in facts.findings if f.kind is FindingKind.NODE_FAILURE])
    cuda = [f for f in ordered if f.kind in GPU_KINDS and f.failure_class is not FailureClass.USER]
    if cuda:
        return _LogRule(_Rule.CUDA, cuda)
    unreadable = [f for f in ordered if f.kind is FindingKind.CHECKPOINT_LOAD]
    if unreadable:
        return _LogRule(_Rule.CHECKPOINT, unreadable)
    # An exception from the code, or a GPU error the code caused (CUDA out of memory, device-side assert).
    # ... and a rank killed for the job's own excess (the host OOM killer, a cgroup limit): restarting repeats it.
    user = [
        f
        for f in ordered
        if (f.kind in USER_KINDS and not _symptom_of_a_fatal_signal(f, ordered))
        or (f.kind in GPU_KINDS | {FindingKind.KILLED} and f.failure_class is FailureClass.USER)
    ]
    if user:
        return _LogRule(_Rule.USER, user)
    lost_peer = _LostPeers(ordered, facts)
    culprits = [f for f in ordered if f.culprit and f.kind not in GPU_KINDS | USER_KINDS and not lost_peer.ended(f)]
    return _LogRule(_Rule.CULPRIT, culprits) if culprits else None


class _LostPeers:
    """The ranks that reported a broken connection (victims) and their nodes: tells a victim's exit from a culprit's."""

    def __init__(self, ordered: list[LogFinding], facts: AttributionFacts) -> None:
        self._facts = facts
        self.ranks = frozenset(f.rank for f in ordered if not f.culprit and f.rank is not None)
        self.nodes = frozenset(n for r in self.ranks if (n := facts.rank_nodes.get(r)))

    def ended(self, f: LogFinding) -> bool:
        """``f`` is how a victim ended. A rank that reported a broken connection and then exited (srun's "Exited
        with exit code 1") died of its peer's death. A launcher's exit that is no rank's own (torchrun's ``failed
        (exitcode: 1)``, srun's line for a task that is a node's torchrun) with an ordinary code, not a signal,
        ended because its children did: a victim when its node's ranks lost their peers, and, where nothing places
        it, no word on where the failure began (on the lab, a node crash under torchrun was read as this line's
        "rank crash" on no node, before the scheduler saw the dead node). A signal (killed, segfault) is the
        launcher's own news and stays a culprit."""
        if f.kind not in EXIT_KINDS or not self.ranks:
            return False
        rank = _rank_of(f, self._facts)
        if rank is not None:
            return rank in self.ranks
        if f.kind is not FindingKind.RANK_EXIT or f.signal is not None:
            return False
        node = _node_of(f, self._facts)
        return node in self.nodes if node else True


def _fatal_signal(f: LogFinding) -> bool:
    """A rank's process reports that a signal stopped it: a segfault or bus error, an abort, or a DataLoader worker
    killed by SIGBUS because ``/dev/shm`` is full (a kill the row files as infrastructure, never the job's own OOM)."""
    return f.culprit and (
        f.kind in (FindingKind.SEGFAULT, FindingKind.FATAL_SIGNAL)
        or (f.kind is FindingKind.KILLED and f.failure_class is FailureClass.INFRASTRUCTURE)
    )


def _symptom_of_a_fatal_signal(exception: LogFinding, ordered: list[LogFinding]) -> bool:
    """``exception`` came after a fatal signal on the same rank (both rank-less: the same output), so it is what the
    signal left behind (a half-written file, an interrupted call, PIL's fallback printed as the worker died), not the
    cause. An exception before the signal stays the cause: a rank that raised and then crashed on its way out."""
    for f in ordered:
        if f is exception:
            return False
        if f.rank == exception.rank and _fatal_signal(f):
            return True
    return False


def _from_log_rule(rule: _LogRule, facts: AttributionFacts, ordered: list[LogFinding]) -> Attribution:
    if rule.rule is _Rule.NODE_FAILURE:
        failed = sorted(set(facts.node_failure_nodes) & set(facts.job_nodes))
        return Attribution(
            failure_class=FailureClass.INFRASTRUCTURE,
            cause=Cause.NODE_FAILURE,
            retryable=True,
            confidence=0.85,
            implicated_nodes=tuple(failed),
            explanation=f"Slurm reported a node failure on {', '.join(failed)}",
            evidence=_evidence(rule.findings),
            basis=EvidenceKind.NODE_FAILURE,
        )
    first = rule.findings[0]
    if rule.rule is _Rule.CUDA:
        # The job's own output: a suspicion of its node until the node agent corroborates it (then rule 1 decides).
        culprit = _culprit(first, facts, FailureClass.HARDWARE, Cause.CUDA_ERROR, 0.8, ordered)
        return culprit.model_copy(update={"basis": EvidenceKind.JOB_HW_ERROR})
    if rule.rule is _Rule.CHECKPOINT:
        return _checkpoint_unreadable(rule.findings)
    if rule.rule is _Rule.USER:
        return _user_bug(rule.findings, facts)
    crash = _culprit(first, facts, FailureClass.UNKNOWN, _EXIT_CAUSES.get(first.kind, Cause.RANK_CRASH), 0.6, ordered)
    return crash.model_copy(update={"basis": EvidenceKind.RANK_EXIT})


def _culprit(
    first: LogFinding,
    facts: AttributionFacts,
    failure_class: FailureClass,
    cause: Cause,
    confidence: float,
    ordered: list[LogFinding],
) -> Attribution:
    node = _node_of(first, facts)
    rank = _rank_of(first, facts)
    victims = sorted({f.rank for f in ordered if not f.culprit and f.rank is not None} - {first.rank})
    who = f"rank {rank}" if rank is not None else f"Slurm task {first.task}" if first.task is not None else ""
    detail = f"{who} failed first ({first.kind})" if who else f"{first.kind}"
    if victims:
        detail += f"; ranks {', '.join(map(str, victims))} only lost their peers"
    return Attribution(
        failure_class=failure_class,
        cause=cause,
        retryable=True,
        confidence=confidence if node else confidence / 2,
        implicated_nodes=(node,) if node else (),
        implicated_ranks=(rank,) if rank is not None else (),
        explanation=detail + (f" on {node}" if node else f"; {_unknown(who, facts)}"),
        evidence=_evidence([first, *[f for f in ordered if f is not first][:4]]),
    )


def _user_bug(user: list[LogFinding], facts: AttributionFacts) -> Attribution:
    exc = user[0].exception or "exception"
    same = [f for f in user if f.exception == user[0].exception]
    nodes = {_node_of(f, facts) for f in same} - {""}
    ranks = sorted({f.rank for f in same if f.rank is not None})
    where = f"ranks {', '.join(map(str, ranks))}" if ranks else "the job"
    return Attribution(
        failure_class=FailureClass.USER,
        cause=Cause.USER_BUG,
        retryable=False,
        confidence=0.95 if len(nodes) > 1 else 0.75,
        implicated_ranks=tuple(ranks),
        explanation=f"{exc} raised by the training code on {where}"
        + (f" across {len(nodes)} nodes" if len(nodes) > 1 else "")
        + ": a restart would fail the same way",
        evidence=_evidence(same[:5]),
        basis=EvidenceKind.CODE,
    )


def _checkpoint_unreadable(findings: list[LogFinding]) -> Attribution:
    named = next((f.checkpoint for f in findings if f.checkpoint), "")
    ranks = sorted({f.rank for f in findings if f.rank is not None})
    return Attribution(
        failure_class=FailureClass.INFRASTRUCTURE,
        cause=Cause.CHECKPOINT_UNREADABLE,
        retryable=False,
        confidence=0.8,
        implicated_ranks=tuple(ranks),
        explanation=f"the job could not read the checkpoint {named or 'it resumes from'}"
        + (f" (ranks {', '.join(map(str, ranks))})" if ranks else "")
        + ": a restart would load it again; an older complete checkpoint makes it retryable",
        evidence=_evidence(findings[:5]),
    )


def _dead_nodes(facts: AttributionFacts) -> list[str]:
    """Unresponsive job nodes, minus those whose ranks were still writing while others went silent.

    A dead host can make its neighbours look unresponsive for a moment (slurmctld's pings time out together);
    a node whose ranks are still printing is alive, so when some unresponsive nodes went silent and others did
    not, only the silent ones are blamed.
    """
    down = sorted(set(facts.unresponsive_nodes) & set(facts.job_nodes))
    if len(down) < 2 or not facts.ranks_logging:
        return down
    logging = set(facts.ranks_logging)
    silent = [n for n in down if not any(r in logging for r, rn in facts.rank_nodes.items() if rn == n)]
    return silent or down


def _node_of(f: LogFinding, facts: AttributionFacts) -> str:
    """The finding's node from facts: its own, else its Slurm task's (the srun label), else its rank's; or ""."""
    if f.node:
        return f.node
    if f.task is not None:
        return facts.ranks.node_of_task(f.task) or ""
    return facts.rank_nodes.get(f.rank, "") if f.rank is not None else ""


def _rank_of(f: LogFinding, facts: AttributionFacts) -> int | None:
    """The finding's rank; an srun task id counts as one only when the facts do not say the launcher is per node."""
    if f.rank_is_task and facts.ranks.launcher is Launcher.PER_NODE:
        return None
    return f.rank


def _unknown(who: str, facts: AttributionFacts) -> str:
    return f"{who or 'the failing rank'}: node unknown ({facts.ranks.unknown})"


def _silent_nodes(facts: AttributionFacts) -> tuple[str, ...]:
    logging = set(facts.ranks_logging)
    silent_ranks = [r for r in facts.rank_nodes if r not in logging]
    nodes = {facts.rank_nodes[r] for r in silent_ranks}
    # A node counts only if all of its ranks went silent: one quiet rank is not a dead host.
    return tuple(sorted(n for n in nodes if all(r in silent_ranks for r, rn in facts.rank_nodes.items() if rn == n)))


def _first_key(f: LogFinding) -> tuple[float, int]:
    return (f.at.timestamp() if f.at else float("inf"), f.order)


def _node_evidence(node: str) -> Evidence:
    return Evidence(source=EvidenceSource.SCHEDULER, text=f"node {node} is DOWN or NOT_RESPONDING", node=node)


def _evidence(findings: Iterable[LogFinding]) -> tuple[Evidence, ...]:
    items = list(findings)
    return tuple(
        Evidence(source=EvidenceSource.LOGS, text=f.text or f.kind, node=f.node, rank=f.rank, at=f.at) for f in items
    )
