"""The scheduler port: what Rebound reads from and does to the scheduler, independent of how it is reached.

Adapters (chosen only in ``workers/``):

| adapter | reads | actions | notes |
|---|---|---|---|
| ``cli.SlurmCliScheduler`` | ``squeue``/``sinfo --json`` | ``scontrol`` | the default; needs the Slurm client |
| ``rest.SlurmRestScheduler`` | slurmrestd ``v0.0.38`` | none | 22.05 REST cannot drain/requeue/exclude/restart |
| ``pyslurm_adapter.PyslurmScheduler`` | libslurm | libslurm | Slurm 25.11 only; untested here |

With slurmrestd, combine: ``CompositeScheduler(reads=SlurmRestScheduler(...), actions=SlurmCliScheduler(...))``.

Contract of every adapter:

* Reads return domain models (``workflows.domain.slurm``) built by one parser; a job or node that does not
  exist is ``None`` from ``get_job``/``get_node`` (Slurm forgets finished jobs after ``MinJobAge``).
* ``snapshot()`` costs a constant number of scheduler calls for the whole cluster (CLI: one ``squeue`` plus
  one ``sinfo``), so one poll serves every watched job. ``observed_at`` is taken *before* the calls: whatever
  happened before ``observed_at`` is reflected in the snapshot.
* Every failure is a ``ReboundError`` whose ``FailureKind`` says whether a retry can help; nothing
  downstream parses messages.
* Actions are idempotent where Slurm allows it, decided on a fresh observation taken just before acting (not
  by parsing Slurm's complaint afterwards), so a retried activity never acts twice:

  - ``drain_node``: already drained with the same reason -> no-op; drained with another reason -> ``NOT_OWNED``
    and the reason is left alone (Slurm would silently overwrite it; ADR-029).
  - ``resume_node``: not drained and not down -> no-op. Ownership is the caller's call: pass
    ``expected_reason`` to make the adapter refuse (``NOT_OWNED``) a node drained for another reason.
  - ``requeue_job``: already pending -> no-op; ``expected_restart_count`` given and already exceeded -> no-op
    (the earlier attempt's requeue went through; without it, a retry after the job restarted would requeue
    it a second time).
  - ``set_excluded_nodes``: replaces the list; same set -> no-op. Only a pending job (or one COMPLETING its
    requeue) can be changed: a running job -> ``SCHEDULER_REJECTED``, a race with its start -> ``SCHEDULER_BUSY``.
  - ``release_job``: a job that is not held, or already running, is left alone. It releases any hold, an
    operator's ``scontrol hold`` (``JobHeldAdmin``) included: callers that care check ``state_reason`` first.
  - ``restart_excluding``: restart a job under its id, kept off the given nodes (with ``user_excluded``: exactly
    the owner's exclusion plus those nodes, stale ones dropped; without: those nodes added). A restart already
    done (the restart count moved past the expected one, or the job is pending) is not done again; a cancelled
    job is never brought back. Each backend does it its own way: the Slurm adapters (``guarded.GuardedActions``) with
    the 22.05 sequence of ADR 009, verified, about 1 s from requeue to RUNNING elsewhere::

        requeue_job(job_id, hold=True, expected_restart_count=n)   # COMPLETING, then PENDING/JobHeldUser
        set_excluded_nodes(job_id, user_excluded + bad_nodes)      # cannot race the job's restart
        release_job(job_id, start_now=old_nodes <= set(bad_nodes)) # see release_job: credentials

  - ``read_submission``: a read, with the actions because only a backend that can submit needs it: the job's
    options as Slurm recorded them and its batch script (``scontrol write batch_script J -``).
  - ``resubmit_excluding``: submit the job again as its owner, off the given nodes, its comment carrying the
    caller's token (ADR 014). Before submitting it looks, on a fresh listing, for a job of that owner already
    carrying the token (an earlier attempt that submitted, then died before its answer was recorded) and
    adopts it: one token, one new job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from workflows.domain.base import Frozen
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob, SlurmNode
from workflows.domain.submission import SubmittedJob

__all__ = [
    "CompositeScheduler",
    "JobSubmission",
    "RestartRequest",
    "RestartResult",
    "ResubmitRequest",
    "ResubmitResult",
    "SchedulerActions",
    "SchedulerPort",
    "SchedulerReads",
]


class RestartRequest(Frozen):
    """Restart a job under its id without the given nodes (``SchedulerActions.restart_excluding``)."""

    job_id: int
    exclude: tuple[str, ...] = ()
    """Nodes the restarted job must not run on."""
    user_excluded: tuple[str, ...] | None = None
    """The job's own exclusion (its owner's, as first seen). When given, the restarted job excludes exactly these
    plus ``exclude``, so exclusions of earlier restarts that are no longer wanted are dropped and the owner's never
    are; None adds ``exclude`` to whatever the job already excludes."""
    previous_nodes: tuple[str, ...] = ()
    """The nodes of the run that failed: the restart may start at once only when all of them are excluded."""
    expected_restart_count: int
    """The restart count when the failure was detected: a higher one means the restart already happened."""


class RestartResult(Frozen):
    """What ``restart_excluding`` left behind, as the adapter last observed the job (before its own release)."""

    state: JobState
    """PENDING or RUNNING for a restarted job; CANCELLED when its owner stopped it and nothing was done."""
    restart_count: int
    started_now: bool = False
    """The restart skipped the scheduler's own hold (every node of the previous run is excluded)."""


class JobSubmission(SubmittedJob):
    """A job's recorded submission and its batch script (``SchedulerActions.read_submission``)."""

    script: bytes
    environment: dict[str, str] | None = None
    """The environment sbatch sent with the job, where the backend could read it; None: not captured."""
    environment_note: str = ""
    """Where the environment came from, or why it was not read."""


class ResubmitRequest(SubmittedJob):
    """Submit the job of this record again (``SchedulerActions.resubmit_excluding``)."""

    script: bytes
    environment: dict[str, str]
    """What sbatch runs with; ``--export=ALL`` hands it to the new job (``submission.job_environment``)."""
    exclude: tuple[str, ...] = ()
    token: str
    """The caller's idempotency token, appended to the comment; a job already carrying it is adopted."""
    not_before: datetime
    """When the token was reserved: a job carrying it must have been submitted after (clock skew allowed)."""


class ResubmitResult(Frozen):
    job_id: int
    adopted: bool
    """An earlier attempt had submitted it: nothing was submitted this time."""


@runtime_checkable
class SchedulerReads(Protocol):
    """Observations of the scheduler. Every call is a fresh observation: adapters never cache."""

    async def snapshot(self) -> ClusterSnapshot:
        """All jobs and all nodes, observed together.

        Raises:
            ReboundError: ``SCHEDULER_UNREACHABLE``, ``SCHEDULER_TIMEOUT``, ``SCHEDULER_BAD_RESPONSE`` or
                ``CONFIGURATION``.
        """
        ...

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """Every job the scheduler still lists, finished ones included until Slurm forgets them.

        Raises:
            ReboundError: As for ``snapshot``.
        """
        ...

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """One job, or None when the scheduler does not (or no longer) know it.

        Raises:
            ReboundError: As for ``snapshot``.
        """
        ...

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """Every node of the cluster.

        Raises:
            ReboundError: As for ``snapshot``.
        """
        ...

    async def get_node(self, name: str) -> SlurmNode | None:
        """One node, or None when the cluster has no node of that name.

        Raises:
            ReboundError: As for ``snapshot``.
        """
        ...

    async def ping(self) -> None:
        """Return when the scheduler's controller answers.

        Raises:
            ReboundError: ``SCHEDULER_UNREACHABLE`` when it does not; others as for ``snapshot``.
        """
        ...


@runtime_checkable
class SchedulerActions(Protocol):
    """Changes to the scheduler's state; each is idempotent as described in the module docstring."""

    async def drain_node(self, node: str, reason: str) -> None:
        """Stop new work from being placed on ``node``; running jobs continue.

        Raises:
            ReboundError: ``NODE_NOT_FOUND``; ``NOT_OWNED`` when already drained with another reason;
                ``SCHEDULER_REJECTED`` for an empty reason; transport kinds as for reads.
        """
        ...

    async def resume_node(self, node: str, *, expected_reason: str | None = None) -> None:
        """Return a drained or down node to service.

        Args:
            node: The node's Slurm name.
            expected_reason: When given, only a node drained with exactly this reason is resumed.

        Raises:
            ReboundError: ``NODE_NOT_FOUND``; ``NOT_OWNED`` when ``expected_reason`` does not match;
                ``SCHEDULER_REJECTED`` when Slurm refuses; transport kinds as for reads.
        """
        ...

    async def requeue_job(self, job_id: int, *, hold: bool = False, expected_restart_count: int | None = None) -> None:
        """Stop the job and put it back in the queue under the same id (``restart_count`` goes up by one).

        Args:
            job_id: The Slurm job id.
            hold: Keep the requeued job from starting until ``release_job`` (``scontrol requeuehold``).
            expected_restart_count: The ``restart_count`` the caller observed; a higher one means this
                requeue already happened, so nothing is done.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_REJECTED`` for a job that may not be requeued
                (``--no-requeue``); ``SCHEDULER_BUSY`` while Slurm cannot take it yet.
        """
        ...

    async def set_excluded_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """Replace the job's excluded nodes (an empty sequence clears them).

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``NODE_NOT_FOUND`` for an unknown node; ``SCHEDULER_REJECTED``
                when the job is running or finished; ``SCHEDULER_BUSY`` when it started meanwhile.
        """
        ...

    async def release_job(self, job_id: int, *, start_now: bool = False) -> None:
        """Release a held job; with ``start_now``, also make it eligible immediately.

        ``start_now`` skips the ``cred_expire`` + 1 s that Slurm holds a requeued job (120 s by default).
        Verified on 22.05 to start a requeued job in about 1 s. It is safe ONLY when the job now excludes every
        node of its previous run: those nodes revoke the job's credential for ``cred_expire`` seconds, and a
        start there ends the job FAILED ("Killing non-startable batch JobId=6: Job credential revoked", seen
        when a 2-node job excluded one of its two old nodes and was forced onto the other).

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_REJECTED`` for a finished job.
        """
        ...

    async def restart_excluding(self, request: RestartRequest) -> RestartResult:
        """Restart the job under its id (``restart_count`` goes up by one), kept off ``request.exclude``.

        Idempotent (module docstring): a retried call after a restart that went through changes nothing. It
        returns once the restart is under way; the caller verifies it on a fresh observation.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_REJECTED`` for a job that may not be restarted
                (``--no-requeue``); ``SCHEDULER_BUSY`` while the scheduler cannot take it yet (the old run is
                still being torn down, or still holds a node that stopped responding); what the actions raise.
        """
        ...

    async def read_submission(self, job_id: int) -> JobSubmission:
        """The job's submission options and batch script, as Slurm recorded them.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_REJECTED`` when Slurm keeps no script (not a batch job);
                ``SCHEDULER_UNSUPPORTED`` for a backend that cannot; transport kinds as for reads.
        """
        ...

    async def resubmit_excluding(self, request: ResubmitRequest) -> ResubmitResult:
        """Submit the job again as its owner, off ``request.exclude``; adopt the job a previous attempt submitted.

        Raises:
            ReboundError: ``SCHEDULER_REJECTED`` when sbatch refuses it; ``SCHEDULER_UNSUPPORTED`` for a backend
                that cannot submit; transport kinds as for reads.
        """
        ...


@runtime_checkable
class SchedulerPort(SchedulerReads, SchedulerActions, Protocol):
    """Reads and actions together: what workers hand to activities."""


class CompositeScheduler:
    """A ``SchedulerPort`` whose reads and actions come from different adapters (slurmrestd + scontrol).

    The actions adapter also reads (to take the fresh observation that makes actions idempotent): those reads
    go through its own backend, not through ``reads``.
    """

    def __init__(self, reads: SchedulerReads, actions: SchedulerActions) -> None:
        self.reads = reads
        self.actions = actions

    async def snapshot(self) -> ClusterSnapshot:
        """See ``SchedulerReads.snapshot``."""
        return await self.reads.snapshot()

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """See ``SchedulerReads.list_jobs``."""
        return await self.reads.list_jobs()

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """See ``SchedulerReads.get_job``."""
        return await self.reads.get_job(job_id)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """See ``SchedulerReads.list_nodes``."""
        return await self.reads.list_nodes()

    async def get_node(self, name: str) -> SlurmNode | None:
        """See ``SchedulerReads.get_node``."""
        return await self.reads.get_node(name)

    async def ping(self) -> None:
        """See ``SchedulerReads.ping``."""
        await self.reads.ping()

    async def drain_node(self, node: str, reason: str) -> None:
        """See ``SchedulerActions.drain_node``."""
        await self.actions.drain_node(node, reason)

    async def resume_node(self, node: str, *, expected_reason: str | None = None) -> None:
        """See ``SchedulerActions.resume_node``."""
        await self.actions.resume_node(node, expected_reason=expected_reason)

    async def requeue_job(self, job_id: int, *, hold: bool = False, expected_restart_count: int | None = None) -> None:
        """See ``SchedulerActions.requeue_job``."""
        await self.actions.requeue_job(job_id, hold=hold, expected_restart_count=expected_restart_count)

    async def set_excluded_nodes(self, job_id: int, nodes: Sequence[str]) -> None:
        """See ``SchedulerActions.set_excluded_nodes``."""
        await self.actions.set_excluded_nodes(job_id, nodes)

    async def release_job(self, job_id: int, *, start_now: bool = False) -> None:
        """See ``SchedulerActions.release_job``."""
        await self.actions.release_job(job_id, start_now=start_now)

    async def restart_excluding(self, request: RestartRequest) -> RestartResult:
        """See ``SchedulerActions.restart_excluding``."""
        return await self.actions.restart_excluding(request)

    async def read_submission(self, job_id: int) -> JobSubmission:
        """See ``SchedulerActions.read_submission``."""
        return await self.actions.read_submission(job_id)

    async def resubmit_excluding(self, request: ResubmitRequest) -> ResubmitResult:
        """See ``SchedulerActions.resubmit_excluding``."""
        return await self.actions.resubmit_excluding(request)


async def gather_snapshot(reads: SchedulerReads) -> ClusterSnapshot:
    """Jobs and nodes read concurrently into one snapshot; both reads finish before either failure is raised.

    Raises:
        ReboundError: The first failure of the two reads.
    """
    observed_at = datetime.now(UTC)
    jobs, nodes = await asyncio.gather(reads.list_jobs(), reads.list_nodes(), return_exceptions=True)
    if isinstance(jobs, BaseException):
        raise jobs
    if isinstance(nodes, BaseException):
        raise nodes
    return ClusterSnapshot(observed_at=observed_at, jobs=jobs, nodes=nodes)
