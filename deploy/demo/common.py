"""What the demo trainer, its fault hooks and the injector share: paths, log lines, the rank's identity, files.

Nothing here imports torch, so the injector and the tests stay fast.

A run directory (``LabLayout.run_dir(run)``) holds:

    logs/                        job-<id>-batch.log, job-<id>-rank-<R>.log (written by sbatch/srun)
    checkpoints/step_000120/     state.pt, meta.json, COMPLETE (see ``deploy.demo.checkpoint``)
    control/fault-<id>.json      a fault request written by the injector
    control/ack-<id>-rank-<R>.json  written by the rank that applied it, holding the true onset time
    ranks/rank-<R>.json          identity of the live process of rank R (pid, node, restart, ...)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

TrainerFaultKind = Literal["crash", "hang", "slow", "gpu-fault", "user-bug"]
"""Faults a rank applies to itself when it finds a request in ``control/``."""

FaultKind = Literal["crash", "segv", "kill", "hang", "slow", "gpu-fault", "xid", "user-bug", "node-crash"]
"""Every fault the injector knows: the trainer-side ones plus the ones done with signals."""


def utc_iso(epoch: float) -> str:
    """``2026-11-30T03:40:01.123Z``: UTC with milliseconds, the timestamp every demo log line starts with."""
    millis = int(epoch * 1000)
    stamp = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}Z"


def log_line(level: str, rank: int, world_size: int, node: str, message: str, *, now: float | None = None) -> str:
    """One trainer log line: ``<ts> [LEVEL] rank=R/W node=N <message>``."""
    stamp = utc_iso(time.time() if now is None else now)
    return f"{stamp} [{level}] rank={rank}/{world_size} node={node} {message}"


def fsync_dir(path: Path) -> None:
    """Persist a rename or create inside ``path``: without it a power loss can undo the rename."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` so that readers see either the old file or the whole new one, never a prefix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, payload: Mapping[str, Any] | BaseModel) -> None:
    """Atomically write one JSON document (a mapping or a pydantic model)."""
    text = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(dict(payload))
    atomic_write_bytes(path, text.encode() + b"\n")


@dataclass(frozen=True)
class RunPaths:
    """The directories of one demo run; see the module docstring."""

    run_dir: Path

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def control(self) -> Path:
        return self.run_dir / "control"

    @property
    def ranks(self) -> Path:
        return self.run_dir / "ranks"

    def rank_file(self, rank: int) -> Path:
        return self.ranks / f"rank-{rank}.json"

    def progress_file(self, rank: int) -> Path:
        """The rank's last started step (a heartbeat file, as many trainers write)."""
        return self.ranks / f"rank-{rank}.progress"

    def fault_file(self, fault_id: str) -> Path:
        return self.control / f"fault-{fault_id}.json"

    def ack_file(self, fault_id: str, rank: int) -> Path:
        return self.control / f"ack-{fault_id}-rank-{rank}.json"

    def ensure(self) -> None:
        """Create every directory (idempotent: all ranks and the batch script race to do it)."""
        for d in (self.logs, self.checkpoints, self.control, self.ranks):
            d.mkdir(parents=True, exist_ok=True)


def _int_list(value: str | None) -> tuple[int, ...]:
    # Slurm GPU lists are plain indexes ("0,1"); CUDA_VISIBLE_DEVICES may hold UUIDs, which name no index.
    if not value:
        return ()
    items = [v.strip() for v in value.split(",") if v.strip()]
    return tuple(int(v) for v in items) if all(v.isdigit() for v in items) else ()


def gpu_index_for(local_rank: int, env: Mapping[str, str]) -> int:
    """The node-level (NVML) index of the GPU a rank uses, as a real trainer picks ``cuda:<local_rank>``.

    ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` hold the physical indexes; ``CUDA_VISIBLE_DEVICES`` may be renumbered
    by cgroup device constraints, so it is only the fallback. Without any list (plain-file fake GPUs) the local
    rank is the best guess.
    """
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        gpus = _int_list(env.get(var))
        if gpus:
            return gpus[local_rank % len(gpus)]
    return local_rank


def _required(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name):
            return env[name]
    raise ValueError(f"{' or '.join(names)} is not set: launch with srun, or set the SLURM_* variables by hand")


@dataclass(frozen=True)
class RankEnv:
    """Who this process is, from the variables srun sets. Never from ``hostname``: all lab nodes share a host."""

    rank: int
    world_size: int
    local_rank: int
    node: str
    restart: int
    job_id: int | None
    gpu: int

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> RankEnv:
        """Parse ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURMD_NODENAME``, ``SLURM_JOB_ID``,
        ``SLURM_RESTART_COUNT`` (default 0) and the GPU lists; under torchrun (one srun task per node, the ranks
        its workers) ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` instead of srun's task variables.

        Raises:
            ValueError: a required variable is missing or the rank is out of range.
        """
        if env.get("RANK") and env.get("WORLD_SIZE"):
            rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_rank = int(env.get("LOCAL_RANK", "0"))
        else:
            rank = int(_required(env, "SLURM_PROCID"))
            world_size = int(_required(env, "SLURM_NTASKS", "SLURM_NPROCS"))
            local_rank = int(env.get("SLURM_LOCALID", "0"))
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            node=_required(env, "SLURMD_NODENAME"),
            restart=int(env.get("SLURM_RESTART_COUNT") or 0),
            job_id=int(job_id) if job_id else None,
            gpu=gpu_index_for(local_rank, env),
        )


class RankInfo(BaseModel):
    """``ranks/rank-<R>.json``: the live process of one rank, written by the rank at start."""

    model_config = ConfigDict(frozen=True)

    pid: int
    rank: int
    world_size: int
    node: str
    local_rank: int
    restart: int
    job_id: int | None
    gpu: int
    proc_start: int | None
    started_at: str


class FaultRequest(BaseModel):
    """``control/fault-<id>.json``: a fault for the ranks to apply to themselves.

    ``rank`` None means every rank. ``job_id``/``restart`` pin the request to one attempt, so a requeued run that
    finds the old file in ``control/`` does not fault again.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    kind: TrainerFaultKind
    rank: int | None
    job_id: int | None
    restart: int | None
    delay_s: float | None = None
    gpu: int | None = None
    xid: int | None = None
    at_step: int | None = None
    """Apply at the start of this step (not at once): how every rank hits the same step's bad batch."""
    created_at: str

    def addressed_to(self, env: RankEnv) -> bool:
        """Whether the rank described by ``env`` must apply this request."""
        return (
            (self.rank is None or self.rank == env.rank)
            and (self.job_id is None or self.job_id == env.job_id)
            and (self.restart is None or self.restart == env.restart)
        )


class FaultAck(BaseModel):
    """``control/ack-<id>-rank-<R>.json``: written just before the rank acts; ``t0_epoch`` is the true onset."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: TrainerFaultKind
    rank: int
    node: str
    pid: int
    job_id: int | None
    restart: int
    step: int
    t0: str
    t0_epoch: float
