"""Inputs and results of the recovery loop's activities: watch, attribute, drain, requeue, wait for resume."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointRef
from workflows.domain.gpu import GpuEvent, NodeGpuVerdict
from workflows.domain.hang import HangPolicy, HangVerdict
from workflows.domain.incident import Anomaly, Attribution, LogFinding
from workflows.domain.procs import RankProcess
from workflows.domain.progress import ProgressSignal, ProgressState
from workflows.domain.ranks import RankMap
from workflows.domain.recovery import StragglerAction
from workflows.domain.slurm import JobState, SlurmJob
from workflows.domain.straggler import StragglerPolicy, StragglerVerdict


class JobWatchInput(Frozen):
    """Watch one job until something changes or goes wrong."""

    job_id: int
    log_patterns: tuple[str, ...] = ()
    """The job's ``logs=`` patterns; empty reads its own stdout/stderr (``docs/detection.md``)."""
    offsets: dict[str, int] = {}
    """Where reading stopped (``activities.logs.tail``): byte offsets and fingerprints per file, and the time the
    job's attempt was first seen (``"\\0since"``); ``{}`` when it was never read: then only what the files gain
    from now on counts (and files the attempt began)."""
    poll_interval_s: float = Field(1.0, gt=0)
    last_state: JobState | None = None
    last_restart_count: int = 0
    heartbeat_patterns: tuple[str, ...] = ()
    """Files the ranks touch while alive (``%j`` = job id): a newer mtime counts as progress."""
    progress: ProgressState | None = None
    """What the previous watch learned about the ranks' progress; None starts afresh."""
    hang: HangPolicy = HangPolicy()
    stragglers: StragglerPolicy = StragglerPolicy()
    straggler_action: StragglerAction = StragglerAction.REPORT
    reported_straggler_nodes: tuple[str, ...] = ()
    """Nodes already reported as stragglers in this attempt: reported again only if the set grows."""
    sample_after_s: float | None = Field(None, gt=0)
    """While the running job has shown no step line: return ``SAMPLE`` after this long, so the workflow samples
    its ranks' stacks and checkpoints (progress without step lines); None: never."""


class WatchOutcome(StrEnum):
    CHANGED = "changed"
    """The job changed state or restart count without evidence of a failure (e.g. PENDING -> RUNNING)."""
    ANOMALY = "anomaly"
    GONE = "gone"
    """The scheduler no longer lists the job."""
    SAMPLE = "sample"
    """The job runs and has shown no step line for ``sample_after_s``: sample its ranks (``JobWatchInput``)."""


class LogAnchorInput(Frozen):
    """Anchor a job's log offsets to its current attempt before the first watch (``LogTail.anchor``)."""

    job_id: int
    log_patterns: tuple[str, ...] = ()
    """The job's ``logs=`` patterns; empty: its own stdout/stderr, as for the watch."""
    job: SlurmJob
    """The job as the workflow last saw it: its start time is the attempt's, its user the files' owner."""


class JobWatchResult(Frozen):
    outcome: WatchOutcome
    observed_at: datetime
    job: SlurmJob | None = None
    anomaly: Anomaly | None = None
    findings: tuple[LogFinding, ...] = ()
    offsets: dict[str, int] = {}
    polls: int = 0
    progress: ProgressState | None = None
    hang: HangVerdict | None = None
    """Set with a ``hang`` anomaly."""
    stragglers: StragglerVerdict | None = None
    """Set with a ``straggler`` anomaly."""


class AttributeInput(Frozen):
    """Gather evidence for an anomaly (a short settle window for late log lines, node states) and attribute it."""

    job_id: int
    anomaly: Anomaly
    job_nodes: tuple[str, ...] = ()
    task_count: int = 0
    """Slurm's task count of the job (kept for recorded histories; ranks are placed by ``rank_map``)."""
    log_patterns: tuple[str, ...] = ()
    offsets: dict[str, int] = {}
    findings: tuple[LogFinding, ...] = ()
    rank_map: RankMap | None = None
    """Rank -> node from facts (the node agents' view of the job's processes); None: only the logs place ranks."""
    gpu_events: tuple[GpuEvent, ...] = ()
    gpu_verdicts: tuple[NodeGpuVerdict, ...] = ()
    """One verdict per GPU of the job's nodes that have a DCGM exporter, merged from NVML and DCGM read now
    (``workflows.policy.gpu_merge``); empty where no exporter is configured."""
    settle_s: float = Field(1.0, ge=0)
    """Keep reading logs this long: a peer's error or srun's summary often lands a moment after the first line."""
    corroborate_s: float = Field(10.0, ge=0)
    """When only silence points at a node, wait up to this long for the scheduler to confirm it is down."""
    hang: HangVerdict | None = None
    """For a hang: the watch's verdict (who went silent first)."""
    odd_ranks: tuple[int, ...] = ()
    """For a hang: ranks whose stack differs from the majority's."""
    processes: tuple[RankProcess, ...] = ()
    """For a hang: the ranks' processes as the node agents saw them."""
    stack_summary: str = ""


class AttributeResult(Frozen):
    attribution: Attribution
    offsets: dict[str, int] = {}
    findings: tuple[LogFinding, ...] = ()
    job_state: JobState | None = None
    """The job's state at the end of the settle window: CANCELLED means its owner stopped it, not a failure."""


class DrainInput(Frozen):
    node: str
    reason: str
    key: str
    """Idempotency key of the decision (``<workflow id>/incident-<n>/drain-<node>``), logged with the action."""


class DrainResult(Frozen):
    node: str
    verified_at: datetime
    drained_by_us: bool
    """False when someone else had already drained it: Rebound leaves such a node exactly as it is."""
    detail: str = ""


class RequeueInput(Frozen):
    job_id: int
    exclude: tuple[str, ...] = ()
    expected_restart_count: int
    """The restart count when the failure was detected: a retry (or Slurm's own requeue) is not requeued again."""
    previous_nodes: tuple[str, ...] = ()
    key: str
    user_excluded: tuple[str, ...] | None = None
    """The job's own exclusion: when given, the restarted job excludes exactly it plus ``exclude`` (stale
    exclusions from earlier restarts are dropped); None adds ``exclude`` to what the job excludes."""


class RequeueResult(Frozen):
    job_id: int
    verified_at: datetime
    state: JobState
    restart_count: int
    excluded_nodes: tuple[str, ...] = ()
    started_now: bool = False


class WaitResumeInput(Frozen):
    """Wait until the restarted job logs a training step (after loading its checkpoint, if it says so)."""

    job_id: int
    log_patterns: tuple[str, ...] = ()
    offsets: dict[str, int] = {}
    expected_restart_count: int = 0
    poll_interval_s: float = Field(0.5, gt=0)
    not_before: datetime | None = None
    """When the restart was verified: step lines stamped earlier are the old attempt's (a hung, slow or silently
    faulted job still trains until Slurm kills it), and unstamped ones count only once the new attempt runs."""
    heartbeat_patterns: tuple[str, ...] = ()
    """The job's heartbeat files (``heartbeat=``): touched after the restart, the job is alive."""
    checkpoint_dir: str = ""
    """The job's ``ckpt=`` directory: a complete checkpoint saved there after the restart means it trains again."""
    restart_checkpoint: CheckpointRef | None = None
    """The latest valid checkpoint when the job was restarted (the one it should resume from); a newer one is new."""


class ResumeOutcome(StrEnum):
    RESUMED = "resumed"
    FAILED_AGAIN = "failed_again"
    GONE = "gone"
    CANCELLED = "cancelled"
    """Its owner cancelled it while Rebound waited for it to train again."""


class WaitResumeResult(Frozen):
    outcome: ResumeOutcome
    observed_at: datetime
    step: int | None = None
    """The first training step the restarted job logged."""
    checkpoint: str = ""
    from_scratch: bool = False
    """The job's own line said it found no checkpoint to load (it starts from step 0)."""
    checkpoint_step: int | None = None
    """The step the loaded checkpoint holds, when the job says: ``step - checkpoint_step - 1`` steps were redone."""
    offsets: dict[str, int] = {}
    job: SlurmJob | None = None
    signal: ProgressSignal | None = None
    """With ``RESUMED``: which signal decided (a step line, a new checkpoint, advancing stacks)."""
    signs_of_life: tuple[ProgressSignal, ...] = ()
    """Every progress signal the restarted attempt showed (with ``FAILED_AGAIN``: it had started, so it did not
    fail "before it trained" unless this is empty)."""
    findings: tuple[LogFinding, ...] = ()
    """With ``FAILED_AGAIN``: the restarted attempt's own crash lines (bounded), attributed by the next incident."""
    new_checkpoint: CheckpointRef | None = None
    """With ``RESUMED`` by ``CHECKPOINT``: the checkpoint the restarted attempt saved."""
