"""The injection record (``injections.jsonl``), the injector's errors, and finding a run's live ranks."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, ValidationError

from deploy.demo.common import FaultKind, RankInfo, RunPaths
from deploy.demo.procs import is_alive, proc_start_ticks
from deploy.local.layout import LabLayout


class InjectionError(RuntimeError):
    """An injection could not be done; the message says why and what to check."""


class UnknownRunError(InjectionError):
    """No such run directory."""


class RankNotRunningError(InjectionError):
    """The rank has no pid file, or its process is gone (stale pid)."""


class NodeNotRunningError(InjectionError):
    """The node has no live slurmd (no pid file, or a stale one)."""


class AckTimeoutError(InjectionError):
    """The rank did not apply the fault in time (it may be hung already, or between attempts)."""


class InjectionRecord(BaseModel):
    """One line of ``injections.jsonl``: what was broken, where, and when it really broke (``t0``).

    ``rank`` is ``None`` for faults on every rank (``user-bug`` on all) and for node faults; ``pids`` are the
    processes signalled (``segv``, ``node-crash``) or the ranks that acknowledged (trainer-side faults).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    kind: FaultKind
    run: str | None
    job_id: int | None
    restart: int | None
    rank: int | None
    node: str | None
    gpu: int | None
    xid: int | None
    delay_s: float | None = None
    pids: list[int] = []
    t0: datetime
    t0_epoch: float
    acked_at: datetime | None = None
    injected_at: datetime


def utc_datetime(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def append_record(layout: LabLayout, record: InjectionRecord) -> None:
    layout.injections.parent.mkdir(parents=True, exist_ok=True)
    # One short O_APPEND write per record: concurrent injectors cannot interleave inside a line.
    with layout.injections.open("a") as f:
        f.write(record.model_dump_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_injections(layout: LabLayout) -> list[InjectionRecord]:
    """Every record of the lab, oldest first (for tests, benchmarks and reports)."""
    if not layout.injections.exists():
        return []
    lines = layout.injections.read_text().splitlines()
    return [InjectionRecord.model_validate_json(line) for line in lines if line.strip()]


def run_paths(layout: LabLayout, run: str) -> RunPaths:
    """The run's directories.

    Raises:
        UnknownRunError: the run directory does not exist.
    """
    paths = RunPaths(layout.run_dir(run))
    if not paths.run_dir.is_dir():
        known = sorted(p.name for p in layout.runs.iterdir()) if layout.runs.is_dir() else []
        raise UnknownRunError(f"unknown run {run!r}: no {paths.run_dir} (known runs: {', '.join(known) or 'none'})")
    return paths


def rank_is_live(info: RankInfo) -> bool:
    # pid plus start time: a pid recycled by an unrelated process must never receive our signals.
    return is_alive(info.pid) and (info.proc_start is None or proc_start_ticks(info.pid) == info.proc_start)


def live_rank(layout: LabLayout, run: str, rank: int) -> RankInfo:
    """The live process of ``rank`` in ``run``.

    Raises:
        UnknownRunError: no such run.
        RankNotRunningError: no pid file for the rank, or its process is gone.
    """
    paths = run_paths(layout, run)
    path = paths.rank_file(rank)
    try:
        info = RankInfo.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        present = sorted(p.name for p in paths.ranks.glob("rank-*.json"))
        raise RankNotRunningError(
            f"run {run!r} has no rank {rank}: {path} missing (present: {', '.join(present) or 'none'})"
        ) from None
    except ValidationError as exc:
        raise RankNotRunningError(f"run {run!r} rank {rank}: unreadable {path}: {exc}") from None
    if not rank_is_live(info):
        raise RankNotRunningError(
            f"run {run!r} rank {rank} is not running: pid {info.pid} from {path} is gone (stale pid; "
            f"job {info.job_id}, restart {info.restart}, node {info.node})"
        )
    return info


def live_ranks(layout: LabLayout, run: str) -> list[RankInfo]:
    """Every live rank of the run's newest attempt."""
    paths = run_paths(layout, run)
    infos: list[RankInfo] = []
    for path in paths.ranks.glob("rank-*.json"):
        try:
            info = RankInfo.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            continue
        if rank_is_live(info):
            infos.append(info)
    if not infos:
        raise RankNotRunningError(f"run {run!r} has no running rank (ranks/ holds no live pid)")
    newest = max(i.restart for i in infos)
    return sorted((i for i in infos if i.restart == newest), key=lambda i: i.rank)
