"""The JobRecovery workflow's inputs, state and answers."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field, NonNegativeFloat, model_validator

from workflows.domain.auth_state import AuthState
from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.fleet import IsolationDecision
from workflows.domain.gpu import GpuEvent
from workflows.domain.hang import HangPolicy, HangVerdict
from workflows.domain.incident import Anomaly, Incident, LogFinding, TimelineEntry
from workflows.domain.liveness import LivenessState
from workflows.domain.notify import Notification
from workflows.domain.progress import ProgressState
from workflows.domain.ranks import RankMap
from workflows.domain.slurm import JobState, SlurmJob
from workflows.domain.straggler import StragglerPolicy, StragglerVerdict
from workflows.domain.submission import SubmissionFacts
from workflows.domain.watch_routing import WatchRouting

#: Incidents kept in state across continue-as-new (older ones stay in the previous runs' histories); the Fleet's
#: answers are kept for as many requests, the newest (a late approval of an older one is in the Fleet's state).
MAX_CARRIED_INCIDENTS = 20
#: Timeline entries kept (the newest): the status query and the Temporal UI show the recent story.
MAX_TIMELINE = 200
#: Signalled GPU events remembered to drop an agent's re-sends; a re-send older than this many is long attributed.
MAX_SEEN_GPU_EVENTS = 256
#: Signalled GPU events waiting for attribution (the first ones of a storm: the same XID again adds nothing).
MAX_PENDING_GPU_EVENTS = 64

#: The restart backoff's default (``DetectionPolicy.restart_backoff_s``): a hardware fault on a healthy job deserves
#: seconds, a crash loop deserves a growing pause.
DEFAULT_RESTART_BACKOFF_S = (0.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: Resubmission tokens remembered (each incident reserves one; the budget caps incidents far below this).
MAX_RESUBMIT_TOKENS = 100

#: What tells two signalled GPU events apart: host, GPU index, XID, the agent's sequence number.
GpuEventKey = tuple[str, int | None, int | None, int]


class RecoveryState(StrEnum):
    """Where a monitored job is in the detect -> attribute -> isolate -> resume loop."""

    STARTING = "STARTING"
    WATCHING = "WATCHING"
    DETECTED = "DETECTED"
    ATTRIBUTED = "ATTRIBUTED"
    ISOLATING = "ISOLATING"
    RESTARTING = "RESTARTING"
    VERIFYING = "VERIFYING"
    FINISHED = "FINISHED"
    GAVE_UP = "GAVE_UP"

    def is_terminal(self) -> bool:
        return self in (RecoveryState.FINISHED, RecoveryState.GAVE_UP)


class StragglerAction(StrEnum):
    """What to do about a rank or node that persistently slows the job down."""

    OFF = "off"
    REPORT = "report"
    """Record an incident naming the slow node; touch nothing (the default: a slowdown is not a failure)."""
    RESTART = "restart"
    """Drain the slow node and restart the job elsewhere, when the projected loss exceeds the restart's cost."""


class RestartSetting(StrEnum):
    """How a job wants to be restarted (``workflows.policy.restart_strategy`` decides from it)."""

    AUTO = "auto"
    """Requeue a requeueable job; resubmit one that cannot be requeued (``--no-requeue``)."""
    REQUEUE = "requeue"
    """Only requeue: a job that cannot be requeued is given up, as before resubmission existed."""
    RESUBMIT = "resubmit"
    """Always resubmit from the job's own script and options, even a requeueable job."""


class RecoverySpec(Frozen):
    """How a job wants to be recovered: from its opt-in comment, an operator selector, or the CLI."""

    checkpoint_dir: str = ""
    restart_budget: int = Field(5, ge=0, le=100)
    policy: str = "default"
    logs: tuple[str, ...] = ()
    """Glob patterns of the ranks' output files; ``%j`` is the job id. Empty: the job's own stdout/stderr."""
    hang_after_s: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    """The job's own hang window (no rank progressed this long): overrides the one learned from its step times."""
    heartbeat: tuple[str, ...] = ()
    """Glob patterns of files the ranks touch while alive (``%j`` = job id): a fresh mtime counts as progress."""
    stragglers: StragglerAction = StragglerAction.REPORT
    restart: RestartSetting = RestartSetting.AUTO
    """Requeue, resubmit, or choose by whether Slurm lets the job be requeued (opt-in key ``restart``)."""
    checkpoint_fallback: CheckpointFallback | None = None
    """What to do about a partial newest checkpoint before a restart (``ckpt_fallback=``); None: the operator's
    setting (``checkpoints.fallback``, default off), filled in when the job is discovered."""
    monitor: bool = True
    """``monitor=off`` in the job's comment: its owner paused Rebound (nothing is done for the job while it says so;
    Slurm authenticates who may change a job's comment: its owner and Slurm's administrators)."""
    capped: tuple[str, ...] = ()
    """What the operator's policy clamped of what the job's comment asked for, one note each (``budget=100 capped
    at 3 by operator policy (selector)``: ``workflows.policy.optin_caps``); the job's timeline shows them."""


class DetectionPolicy(Frozen):
    """How failures that never exit are told: hangs, stragglers, and the evidence taken before acting."""

    hang: HangPolicy = HangPolicy()
    stragglers: StragglerPolicy = StragglerPolicy()
    straggler_restart_cost_s: float = Field(600.0, ge=0)
    """What a restart costs (requeue, start, checkpoint load, redone steps): a straggler's node is drained and the
    job restarted (``stragglers=restart``) only when the time the slowdown would lose until the job's time limit
    is larger."""
    straggler_horizon_s: float = Field(3600.0, gt=0)
    """How far ahead a straggler's loss is projected (Slurm 22.05's job listing gives Rebound no time limit)."""
    stack_dump_timeout_s: float = Field(10.0, gt=0, le=120)
    """Per rank: how long a py-spy dump of a hung rank may take before the job is restarted anyway."""
    silent_sample_s: float = Field(300.0, ge=0)
    """A running job that has shown no step line (nor heartbeat) gets its ranks' stacks and its checkpoint
    directory sampled at a quarter of its hang window (its ``hang=``, learned from its checkpoint cadence, else
    ``hang.silent_default_s``), at most this far apart; while a restart is verified, its stacks every this long;
    0: never."""
    silent_sample_min_s: float = Field(15.0, gt=0)
    """The shortest interval between two such samples (each asks every node agent for py-spy stacks), however
    short the job's hang window."""
    restart_backoff_s: tuple[NonNegativeFloat, ...] = Field(DEFAULT_RESTART_BACKOFF_S, min_length=1)
    """Seconds to wait before restart number n+1 of a job (index n; the last value repeats): the first restart is
    immediate, a crash loop gets a growing pause."""
    rank_map_after_s: float = Field(5.0, ge=0, le=3600)
    """How long after an attempt is seen running the node agents are first asked which rank runs where; asked
    again after twice, then three times as long while some job node shows no rank yet (torchrun's rendezvous
    and the imports take seconds). The map outlives ranks that die later (``RankMap``)."""


class JobRecoveryInput(Frozen):
    """Start (or continue-as-new) the recovery loop of one job."""

    cluster: str
    job_id: int = Field(gt=0)
    poll_interval_s: float = Field(1.0, gt=0, le=300)
    spec: RecoverySpec = RecoverySpec()
    detection: DetectionPolicy = DetectionPolicy()
    fleet_answer_timeout_s: float = Field(3600.0, gt=0)
    """How long to wait for the Fleet's answer (it may wait for an operator); then act as in observe mode."""
    carried: JobRecoveryState | None = None
    """The whole state carried across continue-as-new; None for a fresh start."""
    watch_hub: WatchRouting | None = None
    """How to reach the watch hub (ADR 015, from the worker's ``watch`` settings); None: the per-job watch."""

    @model_validator(mode="before")
    @classmethod
    def _read_status_and_progress(cls, data: Any) -> Any:
        """Read an input written before the state was one model: ``carried`` (the status) + ``carried_progress``.

        Runs continued-as-new by the previous version, and their recorded histories, start with that shape.
        """
        if isinstance(data, dict) and "carried_progress" in data:
            data = dict(data)
            progress = data.pop("carried_progress")
            status = data.get("carried")
            data["carried"] = None if status is None else {"status": status, "progress": progress}
        return data


class JobRecoveryStatus(Frozen):
    """What the ``status`` query answers."""

    cluster: str
    job_id: int
    state: RecoveryState
    job_state: JobState | None = None
    job_name: str = ""
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    last_observed_at: datetime | None = None
    note: str = ""
    timeline: tuple[TimelineEntry, ...] = ()
    incidents: tuple[Incident, ...] = ()
    restarts_used: int = 0
    restart_budget: int = 5
    log_offsets: dict[str, int] = {}
    """Byte offset of every rank output file read so far: a restarted watch neither re-reads nor misses lines."""
    runs: int = 1
    """Workflow runs so far (continue-as-new adds one)."""
    running_since: datetime | None = None
    """When the job's current attempt started running: GPU events from before it are not this attempt's."""
    paused_by: str = ""
    """Set while an operator paused monitoring (``rebound pause JOB``): nothing is watched or done until resumed."""
    lineage: tuple[int, ...] = ()
    """Every Slurm job id of this logical job, oldest first, once it was resubmitted (empty: never resubmitted).
    Rebound's own record of the lineage: ClusterWatch asks it, never a job's comment (ADR 014)."""
    resubmit_tokens: tuple[str, ...] = ()
    """Idempotency tokens reserved for resubmissions whose new job is not recorded yet (``MAX_RESUBMIT_TOKENS``).
    A job carrying one in its comment belongs to this lineage only while it is listed here: once the new job is
    in ``lineage`` the token is resolved and removed, and a copy of it claims nothing."""


class JobRecoveryState(Frozen):
    """Everything one JobRecovery knows, carried whole across continue-as-new (``job_recovery.state.carry``).

    What grows is bounded: incidents and the Fleet's answers (``MAX_CARRIED_INCIDENTS``), the timeline
    (``MAX_TIMELINE``), signalled GPU events (``MAX_PENDING_GPU_EVENTS``, ``MAX_SEEN_GPU_EVENTS``).
    """

    status: JobRecoveryStatus
    progress: ProgressState | None = None
    """What the watch learned about the ranks' progress (step times, silences)."""
    hang: HangVerdict | None = None
    """The verdict behind the watch's last hang anomaly (or its last look)."""
    stragglers: StragglerVerdict | None = None
    """The verdict behind the watch's last straggler anomaly (or its last look)."""
    reported_stragglers: tuple[str, ...] = ()
    """Nodes already reported as stragglers in this attempt of the job (not reported again until a restart)."""
    gpu_events: tuple[GpuEvent, ...] = ()
    """GPU faults signalled by node agents, not yet attributed."""
    seen_gpu_events: tuple[GpuEventKey, ...] = ()
    """Keys of the signalled GPU events taken so far, newest last: a re-sent event is taken once."""
    decisions: tuple[IsolationDecision, ...] = ()
    """The Fleet's answers to this job's isolation requests (the latest word per request), newest last."""
    next_anomaly: Anomaly | None = None
    """Hand-over from one incident to the next: the restarted job failed again."""
    next_findings: tuple[LogFinding, ...] = ()
    """With ``next_anomaly``: the restarted attempt's own crash lines (bounded by the resume check), attributed by
    the next incident: its log offsets are past them."""
    liveness: LivenessState | None = None
    """Samples of a job that prints no step line (stacks, CPU times, checkpoints seen; bounded ranks)."""
    last_job: SlurmJob | None = None
    """The job as the last incident left it (verification's observation)."""
    excluded_nodes: tuple[str, ...] = ()
    """The job's standing exclusion: nodes it suspects (excluded, not drained), kept out of every later placement
    (bounded by the Fleet: ``workflows.policy.fleet.suspicion.MAX_JOB_EXCLUSIONS``)."""
    user_excluded_nodes: tuple[str, ...] | None = None
    """The job's own exclusion (its owner's ``--exclude``) as Rebound first saw it, kept in every restart; None when
    this JobRecovery started before it was recorded (a restart then adds to whatever the job excludes)."""
    pending_notes: tuple[Notification, ...] = ()
    """Notifications decided in synchronous code (the end of the run), sent before the run returns."""
    submission: SubmissionFacts | None = None
    """How the job was submitted, captured when the watch began (for a resubmission); None when not captured."""
    rank_map: RankMap | None = None
    """Rank -> node of the current attempt, from the node agents' view of its processes (taken
    ``rank_map_after_s`` after it ran; bounded by ``MAX_RANK_SPANS``); None before, and after a restart."""
    auth: AuthState = AuthState()
    """Operators' authentication for pause/resume: used credentials, refusals, the audit of their actions."""


class JobRecoveryResult(Frozen):
    """How the workflow ended."""

    job_id: int
    state: RecoveryState
    reason: str = ""


class ObserveJobInput(Frozen):
    job_id: int


class ObserveJobResult(Frozen):
    """A fresh observation of one job; ``job`` is None when the scheduler does not list it."""

    observed_at: datetime
    job: SlurmJob | None = None


JobRecoveryInput.model_rebuild()


class PauseRequest(Frozen):
    """``rebound pause|resume JOB``: who, and why (kept in the job's timeline)."""

    operator: str = Field(min_length=1, max_length=100)
    note: str = Field("", max_length=500)
