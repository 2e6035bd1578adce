"""What went wrong, who is to blame, what Rebound did about it: anomalies, evidence, attributions, actions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.findings import FindingKind
from workflows.domain.gpu import GpuEvent
from workflows.domain.hang import HangVerdict
from workflows.domain.procs import RankProcess, RankStack
from workflows.domain.resume_point import RestartCheckpoint, ResumePoint
from workflows.domain.straggler import StragglerVerdict


class EvidenceSource(StrEnum):
    LOGS = "logs"
    SCHEDULER = "scheduler"
    GPU = "gpu"


class Evidence(Frozen):
    """One observation that supports a finding, verbatim where it came from a log."""

    source: EvidenceSource
    text: str
    node: str = ""
    rank: int | None = None
    at: datetime | None = None
    """When it happened, if the line or record says; else when Rebound saw it."""


class AnomalyKind(StrEnum):
    """What detection saw (before attribution says why)."""

    RANK_CRASH = "rank_crash"
    """A rank died: non-zero exit, traceback, segfault, CUDA-style error in its output."""
    GPU_FAULT = "gpu_fault"
    """An XID or a lost GPU on one of the job's nodes (node agent)."""
    NODE_FAILURE = "node_failure"
    """One of the job's nodes is DOWN or NOT_RESPONDING, or Slurm ended/requeued the job for a node failure."""
    JOB_FAILED = "job_failed"
    """The scheduler says the job ended abnormally, and nothing more specific was seen yet."""
    HANG = "hang"
    """No rank made progress (step lines, heartbeat files) for the job's hang window."""
    STRAGGLER = "straggler"
    """A rank (and its node) persistently slower than its peers: the job runs, but at the straggler's pace."""
    RESTARTED_FROM_SCRATCH = "restarted_from_scratch"
    """The restarted job trains from step 0 although a valid checkpoint existed: its progress was thrown away."""


class Anomaly(Frozen):
    """Detection's output: something is wrong with the job, first observed at ``observed_at``."""

    kind: AnomalyKind
    observed_at: datetime
    summary: str
    evidence: tuple[Evidence, ...] = ()
    gpu_events: tuple[GpuEvent, ...] = ()


class FailureClass(StrEnum):
    """Why the job failed, as far as attribution can tell."""

    HARDWARE = "hardware"
    INFRASTRUCTURE = "infrastructure"
    USER = "user"
    UNKNOWN = "unknown"


class EvidenceKind(StrEnum):
    """What kind of evidence an attribution rests on: it decides how strong an action may be
    (``workflows.policy.action_ladder``). Node-level evidence comes from outside the job; the job's own output and
    its ranks' fates only ever make a node suspect."""

    GPU_AGENT = "gpu-agent"
    """A node agent read the fault from the GPU (XID, lost GPU, double-bit ECC, NVML's throttle reasons)."""
    GPU_DCGM = "gpu-dcgm"
    """The node's DCGM exporter, read by Rebound now, shows a GPU failed (double-bit ECC, row remap failure,
    retired-page limit, a lost GPU), in the merged NVML + DCGM verdict."""
    NODE_DOWN = "node-down"
    """The scheduler lost the node's slurmd (DOWN or NOT_RESPONDING)."""
    NODE_FAILURE = "node-failure"
    """Slurm reported a node failure for the job (``NODE_FAIL``, srun's ``Node failure on nX``)."""
    JOB_HW_ERROR = "job-hw-error"
    """The job printed a CUDA hardware error (``uncorrectable ECC error``, ``illegal memory access``): its own
    output, not the node's word."""
    RANK_EXIT = "rank-exit"
    """A rank died on its own (non-zero exit, segfault, SIGKILL) with no hardware evidence."""
    SILENCE = "silence"
    """Ranks went silent while their peers lost them; the scheduler did not confirm a dead node."""
    KERNEL_STUCK = "kernel-stuck"
    """A hung rank sat in uninterruptible sleep (the job's I/O or the node's driver: not told apart)."""
    SLOWNESS = "slowness"
    """Ranks slower than their peers, with no GPU reporting a slowdown."""
    CODE = "code"
    """The training code's own error: no node is to blame."""
    NONE = "none"
    """Nothing that names a node's fault."""


class ActionRung(StrEnum):
    """How strong an action the evidence allows (``workflows.policy.action_ladder``)."""

    DRAIN = "drain"
    """Node-level evidence: ask the Fleet to drain the node for everyone."""
    EXCLUDE = "exclude"
    """Only the job's word against the node: keep it out of this job's next placement and record a suspicion
    in the Fleet (a repeat within the Fleet's suspicion window escalates to a drain)."""
    NOTHING = "nothing"
    """No node is implicated: restart (or give up) without touching any node."""


class Attribution(Frozen):
    """Who is to blame, with how much confidence, and whether a restart can help."""

    failure_class: FailureClass
    cause: str
    """Short, for drain reasons and search attributes: ``xid-79``, ``node-down``, ``rank-crash``, ``user-bug``."""
    retryable: bool
    confidence: float = Field(ge=0, le=1)
    implicated_nodes: tuple[str, ...] = ()
    implicated_ranks: tuple[int, ...] = ()
    implicated_gpus: tuple[str, ...] = ()
    """``node:index`` of implicated GPUs."""
    explanation: str = ""
    evidence: tuple[Evidence, ...] = ()
    basis: EvidenceKind = EvidenceKind.NONE
    """The kind of evidence the verdict rests on (default: none that names a node's fault, so at most an
    exclusion follows)."""
    action: ActionRung | None = None
    """The rung the action ladder chose; None: an attribution made before the ladder (the Fleet then decides
    on a drain as it always did)."""
    action_reason: str = ""
    """Why that rung, naming the evidence: what the timeline and the audit say."""


class ActionKind(StrEnum):
    DRAIN = "drain"
    REQUEUE = "requeue"
    RESUBMIT = "resubmit"
    QUARANTINE = "quarantine"
    """A partial newest checkpoint set aside before the restart (``ckpt_fallback=quarantine``)."""


class ActionRecord(Frozen):
    """A decision recorded (with its idempotency key) before acting, then the verified result."""

    key: str
    kind: ActionKind
    target: str
    decided_at: datetime
    verified_at: datetime | None = None
    result: str = ""


class TimelineEntry(Frozen):
    """One thing that happened to the job, as the workflow recorded it."""

    at: datetime
    event: str
    detail: str = ""
    incident: int | None = None


class Incident(Frozen):
    """One failure of the job and Rebound's response to it, with the latencies the benchmark reads."""

    number: int
    id: str
    """``<job id>-<number>``: also in drain reasons and idempotency keys."""
    detected_at: datetime
    anomaly: Anomaly
    attribution: Attribution | None = None
    actions: tuple[ActionRecord, ...] = ()
    restarted_at: datetime | None = None
    """When the last recovery action was verified (drain seen by sinfo, requeue with exclusion seen by squeue)."""
    resumed_at: datetime | None = None
    """When the job logged a training step after loading its checkpoint."""
    resumed_from: str = ""
    outcome: str = ""
    hang: HangVerdict | None = None
    """For a hang: the window, who went silent first, the silence per rank."""
    stragglers: StragglerVerdict | None = None
    """For a straggler: the slow ranks and nodes, by how much, against which threshold."""
    stacks: tuple[RankStack, ...] = ()
    """Every rank's stack, dumped before the hung job was killed (bounded text per rank)."""
    processes: tuple[RankProcess, ...] = ()
    """The ranks' processes (state, CPU time, wait channel) when the hang was confirmed."""
    odd_ranks: tuple[int, ...] = ()
    """Ranks whose stack differs from the majority's: the likely culprits of a hang."""
    checkpoint: RestartCheckpoint | None = None
    """The job's checkpoints before the restart: the one it should resume from, the steps lost, a partial save."""
    resume_point: ResumePoint | None = None
    """Where the restarted job started, against ``checkpoint``."""

    @property
    def recovery_action_s(self) -> float | None:
        if self.restarted_at is None:
            return None
        return (self.restarted_at - self.detected_at).total_seconds()


class LogFinding(Frozen):
    """One crash finding from a rank's output, as attribution needs it (read by ``activities.logs.crash``)."""

    kind: FindingKind
    rank: int | None = None
    node: str = ""
    exception: str = ""
    at: datetime | None = None
    order: int = 0
    """Position in reading order: the tie-breaker when lines carry no timestamp."""
    text: str = ""
    culprit: bool = False
    failure_class: FailureClass | None = None
    """The rule's hint (``hardware``, ``user``...): a CUDA out-of-memory is the program's, not the GPU's."""
    checkpoint: str = ""
    """The checkpoint a ``checkpoint_load`` finding could not read, as the log names it (the failing line, or the
    load line before it on the same rank); empty when no line names it."""
    task: int | None = None
    """The Slurm task that wrote the line (srun ``--label``) or that srun's line names: placed by the task's node."""
    rank_is_task: bool = False
    """``rank`` is only that task id: the rank under srun per rank, the node's index under torchrun."""
    signal: int | None = None
    """The signal the line says ended the process (torchrun's ``exitcode: -9``, a ``Killed``); None: an ordinary
    exit, or the line does not say."""
