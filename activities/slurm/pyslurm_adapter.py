"""The scheduler port over pyslurm (libslurm bindings), for clusters running Slurm 25.11.

**Fidelity gap, stated plainly:** pyslurm 25.11 builds only against Slurm 25.11's headers ("Slurm version
mismatch: requires Slurm 25.11, found 22.5" on Debian 12), so this adapter has never run against a real
cluster. What is tested here: the "not installed" error and the mapping functions, on plain objects shaped
like pyslurm's ``Job``/``Node`` (attribute names from pyslurm's ``core/job/job.pyx`` and ``core/node.pyx``),
plus the call sequence against a stand-in module. Unverified: the exact attribute types in 25.11 (times
as int or datetime, ``state`` as ``"MIXED+DRAIN"`` or a list: both are accepted), whether
``Node(state=..., reason=...)`` is writable in 25.11, and how an empty ``excluded_nodes`` clears the list.
Run ``tests/e2e/test_slurm_adapters.py`` against a 25.11 cluster before relying on it.

pyslurm is imported lazily, inside the constructor, so nothing else needs it installed. Its calls block
in C, so each runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import ModuleType
from typing import TypeVar

from activities.slurm.errors import default_kind
from activities.slurm.guarded import GuardedActions, SlurmCallError
from activities.slurm.parse import parse_job, parse_node
from activities.slurm.port import JobSubmission
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot, SlurmJob, SlurmNode

__all__ = ["PyslurmScheduler", "SUPPORTED_PYSLURM", "job_from_pyslurm", "load_pyslurm", "node_from_pyslurm"]

#: The pyslurm release line this adapter was written against (it must match the cluster's Slurm release).
SUPPORTED_PYSLURM = "25.11"
_T = TypeVar("_T")


def load_pyslurm() -> ModuleType:
    """Import pyslurm.

    Raises:
        ReboundError: ``CONFIGURATION`` when pyslurm is missing or not a 25.11 release.
    """
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as e:
        raise ReboundError(
            FailureKind.CONFIGURATION,
            f"pyslurm is not installed (pip install 'rebound[pyslurm]'); it needs Slurm {SUPPORTED_PYSLURM} and "
            f"its libslurm headers. Slurm 22.05 clusters use the cli or rest backend: {e}",
        ) from e
    version = str(getattr(module, "__version__", ""))
    if not version.startswith(SUPPORTED_PYSLURM):
        raise ReboundError(
            FailureKind.CONFIGURATION, f"pyslurm {version or '(unknown version)'} found; needs {SUPPORTED_PYSLURM}"
        )
    return module


def job_from_pyslurm(job: object) -> SlurmJob:
    """Map a ``pyslurm.Job`` (or anything with its attributes) to the domain model.

    It is turned into the ``v0.0.38`` JSON shape and parsed by ``parse.parse_job``, so both paths share one set
    of rules. pyslurm already decodes the exit status and expands output patterns; its ``state_reason`` is
    Slurm's description when there is one, so ``state_description`` stays empty.

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when an attribute has an unusable type.
    """
    code, signal = _get(job, "exit_code"), _get(job, "exit_code_signal")
    raw_exit = signal if isinstance(signal, int) and signal else (code << 8 if isinstance(code, int) else None)
    return parse_job(
        {
            "job_id": _get(job, "id"),
            "name": _get(job, "name"),
            "user_name": _get(job, "user_name"),
            "partition": _get(job, "partition"),
            "job_state": _get(job, "state"),
            "state_reason": _get(job, "state_reason"),
            "nodes": _get(job, "allocated_nodes"),
            "batch_host": _get(job, "batch_host"),
            "batch_flag": _get(job, "is_batch_job"),
            "restart_cnt": _get(job, "requeue_count"),
            "requeue": _get(job, "is_requeueable"),
            "excluded_nodes": _get(job, "excluded_nodes"),
            "required_nodes": _get(job, "required_nodes"),
            "node_count": _get(job, "num_nodes"),
            "tasks": _get(job, "ntasks"),
            "exit_code": raw_exit,
            "comment": _get(job, "comment"),
            "standard_output": _get(job, "standard_output"),
            "standard_error": _get(job, "standard_error"),
            "current_working_directory": _get(job, "working_directory"),
            "submit_time": _epoch(_get(job, "submit_time")),
            "eligible_time": _epoch(_get(job, "eligible_time")),
            "start_time": _epoch(_get(job, "start_time")),
            "end_time": _epoch(_get(job, "end_time")),
            "tres_per_node": _gres(_get(job, "gres_per_node"), prefix="gres:"),
        },
        source="pyslurm",
    )


def node_from_pyslurm(node: object) -> SlurmNode:
    """Map a ``pyslurm.Node`` (or anything with its attributes) to the domain model.

    Raises:
        ReboundError: ``SCHEDULER_BAD_RESPONSE`` when an attribute has an unusable type.
    """
    return parse_node(
        {
            "name": _get(node, "name"),
            "state": _get(node, "state"),
            "reason": _get(node, "reason"),
            "reason_set_by_user": _get(node, "reason_user"),
            "reason_changed_at": _epoch(_get(node, "reason_time")),
            "partitions": _get(node, "partitions"),
            "gres": _gres(_get(node, "configured_gres")),
            "gres_used": _gres(_get(node, "alloc_gres")),
            "cpus": _get(node, "total_cpus"),
            "alloc_cpus": _get(node, "alloc_cpus"),
        },
        source="pyslurm",
    )


class PyslurmScheduler(GuardedActions):
    """``SchedulerPort`` over pyslurm 25.11.

    Args:
        module: The pyslurm module; None imports it (tests pass a stand-in).

    Raises:
        ReboundError: ``CONFIGURATION`` when pyslurm cannot be imported.
    """

    def __init__(self, module: ModuleType | None = None) -> None:
        self._slurm = module if module is not None else load_pyslurm()

    async def snapshot(self) -> ClusterSnapshot:
        """See ``SchedulerReads.snapshot`` (two RPCs, run one after the other: libslurm is not async).

        Raises:
            ReboundError: Classified RPC failures.
        """
        observed_at = datetime.now(UTC)
        return ClusterSnapshot(observed_at=observed_at, jobs=await self.list_jobs(), nodes=await self.list_nodes())

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """See ``SchedulerReads.list_jobs``.

        Raises:
            ReboundError: Classified RPC failures.
        """
        jobs = await self._call(lambda: list(self._slurm.Jobs.load().values()), reading=True)
        return tuple(job_from_pyslurm(job) for job in jobs)

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """See ``SchedulerReads.get_job``.

        Raises:
            ReboundError: Classified RPC failures other than an unknown job id.
        """
        try:
            job = await self._call(lambda: self._slurm.Job.load(job_id), reading=True)
        except ReboundError as e:
            if e.kind is FailureKind.JOB_NOT_FOUND:
                return None
            raise
        return job_from_pyslurm(job)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """See ``SchedulerReads.list_nodes``.

        Raises:
            ReboundError: Classified RPC failures.
        """
        nodes = await self._call(lambda: list(self._slurm.Nodes.load().values()), reading=True)
        return tuple(node_from_pyslurm(node) for node in nodes)

    async def get_node(self, name: str) -> SlurmNode | None:
        """See ``SchedulerReads.get_node`` (all nodes, filtered: pyslurm's single-node load is not needed).

        Raises:
            ReboundError: Classified RPC failures.
        """
        return next((node for node in await self.list_nodes() if node.name == name), None)

    async def ping(self) -> None:
        """See ``SchedulerReads.ping``: a node listing stands in for a ping (one cheap RPC to slurmctld).

        Raises:
            ReboundError: Classified RPC failures.
        """
        await self.list_nodes()

    async def _drain(self, node: str, reason: str) -> None:
        slurm = self._slurm
        await self._call(lambda: slurm.Node(node).modify(slurm.Node(state="DRAIN", reason=reason)))

    async def _resume(self, node: str) -> None:
        slurm = self._slurm
        await self._call(lambda: slurm.Node(node).modify(slurm.Node(state="RESUME")))

    async def _requeue(self, job_id: int, hold: bool) -> None:
        await self._call(lambda: self._slurm.Job(job_id).requeue(hold=hold))

    async def _hold(self, job_id: int) -> None:
        await self._call(lambda: self._slurm.Job(job_id).hold(mode="user"))

    async def _set_excluded(self, job_id: int, hostlist: str) -> None:
        slurm = self._slurm
        await self._call(lambda: slurm.Job(job_id).modify(slurm.JobSubmitDescription(excluded_nodes=hostlist)))

    async def _release(self, job_id: int) -> None:
        await self._call(lambda: self._slurm.Job(job_id).release())

    async def _start_now(self, job_id: int) -> None:
        slurm = self._slurm
        await self._call(lambda: slurm.Job(job_id).modify(slurm.JobSubmitDescription(begin_time="now")))

    async def read_submission(self, job_id: int) -> JobSubmission:
        """Not supported here: resubmission (ADR 014) was built and verified with the CLI adapter only.

        Raises:
            ReboundError: ``SCHEDULER_UNSUPPORTED``, always.
        """
        raise ReboundError(
            FailureKind.SCHEDULER_UNSUPPORTED,
            f"job {job_id}: the pyslurm adapter cannot read a job's submission; resubmission needs the CLI adapter",
        )

    async def _submit(self, args: Sequence[str], script: bytes, env: Mapping[str, str]) -> int:
        raise ReboundError(
            FailureKind.SCHEDULER_UNSUPPORTED, "the pyslurm adapter cannot submit jobs; resubmission needs the CLI"
        )

    async def _call(self, fn: Callable[[], _T], *, reading: bool = False) -> _T:
        """Run one blocking pyslurm call in a thread and classify its ``RPCError`` by Slurm error number."""
        try:
            return await asyncio.to_thread(fn)
        except self._slurm.RPCError as e:
            errno = getattr(e, "errno", None)
            number = errno if isinstance(errno, int) else -1
            kind = default_kind(number)
            if reading and kind is FailureKind.SCHEDULER_REJECTED:
                kind = FailureKind.SCHEDULER_UNREACHABLE  # an unnamed read failure: retrying is harmless
            raise SlurmCallError(kind, f"pyslurm: {e}", number) from e
        except Exception as e:  # pyslurm's own validation (ValueError, MemoryError...): classified, not swallowed
            kind = FailureKind.SCHEDULER_BAD_RESPONSE if reading else FailureKind.SCHEDULER_REJECTED
            raise SlurmCallError(kind, f"pyslurm: {type(e).__name__}: {e}") from e


def _get(obj: object, name: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _epoch(value: object) -> object:
    """pyslurm gives times as epoch ints; tolerate datetimes too. Other types are left for the parser to reject."""
    if isinstance(value, datetime):
        return int(value.timestamp())
    return value


def _gres(value: object, prefix: str = "") -> object:
    """pyslurm's GRES dicts (``{"gpu": 4}``) as Slurm's strings (``gpu:4``); strings pass through."""
    if isinstance(value, Mapping):
        return ",".join(f"{prefix}{name}:{count}" for name, count in value.items())
    return value
