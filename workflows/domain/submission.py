"""How a job was submitted, and its resubmission: what JobRecovery keeps to submit the same job again (ADR 014).

The batch script and the environment never enter workflow history: the script may be large, the environment
may hold secrets (tokens, passwords in variables). Both stay in files under the worker's state directory
(mode 0600); history carries their path, size and digest only.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.slurm import JobState

#: Prefix of the idempotency token Rebound appends to a resubmitted job's comment (after a ``|``, so the
#: opt-in spec before it is left as it is: ``workflows.policy.optin``).
RESUBMIT_TOKEN_KEY = "rb-resubmit="


class SubmissionOptions(Frozen):
    """The ``sbatch`` options of a job, as Slurm recorded them (``squeue --json``), enough to submit it again.

    Zero, empty or None: Slurm recorded nothing (the partition's default applies again).
    """

    name: str = ""
    partition: str = ""
    nodes: int = Field(0, ge=0)
    ntasks: int = Field(0, ge=0)
    ntasks_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(0, ge=0)
    gres: str = ""
    """Slurm's ``tres_per_node`` (``gres:gpu:2``), given back to ``--gres`` without the ``gres:`` prefix."""
    time_limit_min: int = Field(0, ge=0)
    mem_per_node_mb: int = Field(0, ge=0)
    mem_per_cpu_mb: int = Field(0, ge=0)
    output: str = ""
    """The stdout pattern as submitted (``%j`` and friends kept: the new job fills in its own id)."""
    error: str = ""
    comment: str = ""
    account: str = ""
    qos: str = ""
    excluded_nodes: tuple[str, ...] = ()
    requeue: bool = False


class SubmittedJob(Frozen):
    """Who submitted a job, from where, with which options (the scheduler's record, without the script)."""

    job_id: int
    user: str = ""
    user_id: int = Field(ge=0)
    group_id: int = Field(ge=0)
    working_directory: str
    options: SubmissionOptions


class SubmissionFacts(SubmittedJob):
    """A job's submission, captured when Rebound began watching it (``slurm_capture_submission``)."""

    script_path: str
    """The batch script's copy on the worker (``<state_dir>/submissions/...``, mode 0600)."""
    script_sha256: str
    script_bytes: int = Field(ge=0)
    environment_path: str = ""
    """The environment's copy on the worker (NUL-separated, mode 0600); empty when it was not captured."""
    environment_note: str = ""
    """How the environment was captured, or why not (and what the resubmitted job gets instead)."""
    captured_at: datetime


class CaptureSubmissionInput(Frozen):
    cluster: str
    job_id: int


class CaptureSubmissionResult(Frozen):
    """The captured facts, or why none could be captured (the job then cannot be resubmitted)."""

    facts: SubmissionFacts | None = None
    note: str = ""


class ResubmitInput(Frozen):
    """Resubmit the job of ``facts`` as its owner, off ``exclude`` (``slurm_resubmit_job``)."""

    facts: SubmissionFacts
    exclude: tuple[str, ...] = ()
    token: str = Field(min_length=8)
    """Reserved in workflow state before this activity runs: the retry that finds a job carrying it adopts it."""
    reserved_at: datetime
    key: str


class ResubmitOutcome(Frozen):
    """The new job, verified on a fresh observation."""

    job_id: int
    adopted: bool
    """True when an earlier attempt had already submitted it (found by its token), so nothing was submitted."""
    state: JobState
    excluded_nodes: tuple[str, ...] = ()
    verified_at: datetime
