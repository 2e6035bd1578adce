"""What Rebound knows about a Slurm cluster: jobs, nodes and snapshots of both.

These models are scheduler-neutral in shape (a later Kubernetes port fills the same fields) but keep Slurm's
vocabulary, since Slurm is the first and main scheduler. Adapters in ``activities.slurm`` build them from
``squeue --json``/``sinfo --json``, slurmrestd or pyslurm; nothing downstream sees raw scheduler output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import TypeVar, cast

from workflows.domain.base import Frozen

_K = TypeVar("_K")
_V = TypeVar("_V")


class JobState(StrEnum):
    """Base job states as Slurm names them (``job_state`` in ``squeue --json``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    UNKNOWN = "UNKNOWN"

    def is_terminal(self) -> bool:
        """True when the job will never run again without an outside action (requeue or resubmission)."""
        return self in _TERMINAL_JOB_STATES

    def is_active(self) -> bool:
        """True while the job holds, or waits for, an allocation."""
        return self in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)

    def is_failure(self) -> bool:
        """True for terminal states that mean the job did not finish by itself."""
        return self.is_terminal() and self not in (JobState.COMPLETED, JobState.CANCELLED)


_TERMINAL_JOB_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
    }
)


class NodeBaseState(StrEnum):
    """A node's base state (``state`` in ``sinfo --json``, lower-case there)."""

    IDLE = "idle"
    MIXED = "mixed"
    ALLOCATED = "allocated"
    DOWN = "down"
    ERROR = "error"
    FUTURE = "future"
    UNKNOWN = "unknown"


class SlurmJob(Frozen):
    """One job as the scheduler sees it right now.

    Field meanings follow what the adapters verified against Slurm 22.05 (``activities.slurm.parse``). Where
    Slurm's raw values mislead, estimates and leftovers of an earlier run are dropped rather than passed on.
    """

    job_id: int
    name: str = ""
    user: str = ""
    user_id: int | None = None
    """The numeric uid the job runs as; None when the scheduler did not say. Log access checks file owners by it."""
    partition: str = ""
    """As Slurm reports it; a job pending in several partitions lists them comma-separated."""
    state: JobState
    state_reason: str = ""
    """Slurm's reason code (``BeginTime``, ``NonZeroExitCode``, ``JobHeldUser``); empty for ``None``."""
    state_description: str = ""
    """Slurm's longer explanation, when it gives one (a pending job's unavailable nodes, for example)."""
    nodes: tuple[str, ...] = ()
    """Allocated nodes, expanded from Slurm's hostlist (``n[1-2]`` -> ``("n1", "n2")``). For a COMPLETING job Slurm
    lists only the nodes still completing here: ``allocated_nodes`` has the whole allocation."""
    allocated_nodes: tuple[str, ...] = ()
    """A COMPLETING job's whole allocation (``squeue --json``'s ``job_resources.nodes``); empty for every other
    state, and when the scheduler does not say."""
    batch_host: str = ""
    restart_count: int = 0
    """Slurm's ``restart_cnt``: incremented by every requeue, already while the requeued job is COMPLETING."""
    requeue_allowed: bool = False
    excluded_nodes: tuple[str, ...] = ()
    required_nodes: tuple[str, ...] = ()
    node_count: int = 0
    task_count: int = 0
    exit_code: int | None = None
    """Exit status of the batch script once the job is terminal; None before, and when a signal killed it."""
    exit_signal: int | None = None
    """The signal that killed the batch script, when one did."""
    comment: str = ""
    standard_output: str = ""
    """Path of the batch script's stdout with Slurm's ``%j``-style patterns filled in."""
    standard_error: str = ""
    """Path of the batch script's stderr; the stdout path when Slurm joins them (no ``--error``)."""
    working_directory: str = ""
    submit_time: datetime | None = None
    """Slurm resets this on every requeue."""
    eligible_time: datetime | None = None
    """When the job may start: after a requeue, Slurm holds it until about ``cred_expire`` + 1 s."""
    start_time: datetime | None = None
    """When the current (or last) run started; None while PENDING, where Slurm only has an estimate."""
    end_time: datetime | None = None
    """When the job ended; None until it is terminal (Slurm's value before that is a projected limit)."""
    tres_per_node: str = ""
    gpus_per_node: int | None = None
    """GPUs the job asks for on each node (0: none); None when unknown (asked per job or per task, or not said)."""
    cpus_per_node: int = 0
    """CPUs the job needs on each node (Slurm's ``minimum_cpus_per_node``); 0 when unknown."""
    array_job_id: int | None = None
    """For a task of a job array: the array's master id (``%A``); None for a job that is not an array task."""
    array_task_id: int | None = None
    """For a task of a job array: its index (``%a``); the task's own id is ``job_id`` (``%j``)."""
    het_job_id: int | None = None
    """For a component of a heterogeneous job: the leader's id (``het_job_id``); None otherwise."""
    het_job_offset: int | None = None
    """For a component of a heterogeneous job: its offset (0 for the leader, which runs the batch script)."""

    @property
    def is_heterogeneous(self) -> bool:
        """True for a component of a heterogeneous job (``sbatch ... : ...`` or ``#SBATCH hetjob``)."""
        return self.het_job_id is not None


class SlurmNode(Frozen):
    """One node as the scheduler sees it right now."""

    name: str
    state: NodeBaseState
    flags: tuple[str, ...] = ()
    """Upper-case state flags, e.g. ``DRAIN``, ``NOT_RESPONDING``, ``COMPLETING``."""
    reason: str = ""
    """Why the node is drained or down, as whoever set it wrote it. Rebound's own drains carry its prefix, so
    callers check ownership here before resuming a node (ADR-029: never clear someone else's drain)."""
    reason_set_by_user: str = ""
    reason_changed_at: datetime | None = None
    partitions: tuple[str, ...] = ()
    gres: str = ""
    gres_used: str = ""
    cpus: int = 0
    """The node's CPUs; 0 when unknown."""
    alloc_cpus: int = 0
    gpus: int | None = None
    """The node's GPUs, from ``gres`` (0 for a node without GPUs); None when unknown."""

    @property
    def is_drained(self) -> bool:
        """Drain requested (the node may still be finishing work: Slurm shows ``drng`` then)."""
        return "DRAIN" in self.flags

    @property
    def is_responding(self) -> bool:
        """False when slurmctld has lost contact with the node's slurmd."""
        return "NOT_RESPONDING" not in self.flags

    @property
    def is_usable(self) -> bool:
        """True when new work could be placed on the node."""
        return (
            self.state in (NodeBaseState.IDLE, NodeBaseState.MIXED, NodeBaseState.ALLOCATED)
            and not self.is_drained
            and self.is_responding
        )


class ClusterSnapshot(Frozen):
    """All jobs and nodes, observed at one moment. One snapshot serves every job a worker watches."""

    observed_at: datetime
    jobs: tuple[SlurmJob, ...] = ()
    nodes: tuple[SlurmNode, ...] = ()

    def job(self, job_id: int) -> SlurmJob | None:
        """The job with this id, or None when the scheduler no longer (or not yet) lists it. O(1) after the first
        lookup: every watched job looks itself up in the same snapshot each poll."""
        return _indexed(self, "_jobs_by_id", self.jobs, lambda j: j.job_id).get(job_id)

    def node(self, name: str) -> SlurmNode | None:
        """The node with this name, or None when it is not part of the cluster (O(1) after the first lookup)."""
        return _indexed(self, "_nodes_by_name", self.nodes, lambda n: n.name).get(name)


def _indexed(owner: Frozen, slot: str, items: tuple[_V, ...], key: Callable[[_V], _K]) -> Mapping[_K, _V]:
    """``items`` by ``key`` (the first of duplicates, as a scan finds it), built once per tuple and kept beside the
    model's fields like a ``cached_property``: never serialised nor compared. The cache remembers which tuple it
    indexes, so a ``model_copy(update=...)`` that replaces the tuple gets a new index, not the copied stale one."""
    cached = owner.__dict__.get(slot)
    if cached is not None and cached[0] is items:
        return cast("Mapping[_K, _V]", cached[1])
    index: dict[_K, _V] = {}
    for item in items:
        index.setdefault(key(item), item)
    owner.__dict__[slot] = (items, index)
    return index
