"""Maintenance reservations and the node check's job, over Slurm's commands (ADR 018).

``scontrol create|show|delete reservation``, ``sbatch`` and ``scancel``, each an argument list through the CLI
adapter's ``run`` (never a shell). Slurm 22.05's REST API has no reservation writes, so this is CLI-only, like
drains. Observed on the lab (Slurm 22.05.8): a reservation can be made on a drained node; ``Flags=MAINT`` keeps
every job without ``--reservation`` off the node while it stands; ``IGNORE_JOBS`` lets it be made while a job is
still finishing there; an unknown reservation makes ``scontrol show`` exit 1 with ``Reservation ... not found``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.errors import kind_from_text
from workflows.domain.base import Frozen
from workflows.domain.errors import FailureKind, ReboundError

__all__ = ["CheckJobRequest", "MaintenancePort", "Reservation", "SlurmCliMaintenance", "check_script"]


class Reservation(Frozen):
    name: str
    nodes: str = ""
    """Slurm's host list (``n2``)."""
    flags: str = ""
    users: str = ""
    state: str = ""


class CheckJobRequest(Frozen):
    node: str
    reservation: str
    ranks: int
    gpus: int = 0
    time_limit_min: int
    comment: str
    output: str
    """The output file pattern (``%j`` = the job id)."""
    command: tuple[str, ...]
    """The check program's argument list, run by ``srun`` once per rank."""


@runtime_checkable
class MaintenancePort(Protocol):
    """What the node check does to Slurm beyond drain/resume (those are the scheduler port's)."""

    async def show_reservation(self, name: str) -> Reservation | None:
        """The reservation, or None when Slurm has none of that name."""
        ...

    async def create_reservation(self, name: str, node: str, minutes: int, user: str) -> None:
        """A MAINT reservation of ``node`` for ``user``, starting now."""
        ...

    async def delete_reservation(self, name: str) -> None:
        """Delete it (an unknown one is not an error)."""
        ...

    async def submit_check(self, request: CheckJobRequest) -> int:
        """Submit the check job; returns its id."""
        ...

    async def cancel(self, job_id: int) -> None:
        """Cancel the job (a finished one is not an error)."""
        ...


def check_script(command: Sequence[str], ranks: int) -> bytes:
    """The check job's batch script: the program once per rank, each argument quoted (settings, not users')."""
    argv = " ".join(shlex.quote(a) for a in command)
    return f"#!/bin/sh\nexec srun --ntasks={ranks} --kill-on-bad-exit=0 {argv}\n".encode()


class SlurmCliMaintenance:
    """``MaintenancePort`` over the CLI adapter's commands."""

    def __init__(self, cli: SlurmCliScheduler) -> None:
        self._cli = cli

    async def show_reservation(self, name: str) -> Reservation | None:
        result = await self._cli.run("scontrol", "-o", "show", "reservation", name)
        text = result.stdout.decode("utf-8", "replace")
        if result.returncode != 0:
            said = (result.stderr + text).strip()
            if "not found" in said.lower():
                return None
            raise ReboundError(_read_kind(said), f"scontrol show reservation {name}: {said[:300]}")
        fields = dict(tok.split("=", 1) for tok in text.split() if "=" in tok)
        if fields.get("ReservationName") != name:
            return None
        return Reservation(
            name=name,
            nodes=fields.get("Nodes", ""),
            flags=fields.get("Flags", ""),
            users=fields.get("Users", ""),
            state=fields.get("State", ""),
        )

    async def create_reservation(self, name: str, node: str, minutes: int, user: str) -> None:
        await self._checked(
            "scontrol", "create", "reservation", f"ReservationName={name}", f"Nodes={node}", "StartTime=now",
            f"Duration={minutes}", f"Users={user}", "Flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip

    async def delete_reservation(self, name: str) -> None:
        if await self.show_reservation(name) is None:
            return
        result = await self._cli.run("scontrol", "delete", f"ReservationName={name}")
        if result.returncode != 0:
            text = (result.stderr.strip() or result.stdout.decode("utf-8", "replace").strip())[:300]
            # "Requested reservation is in use": a job of it is still ending (seen on 22.05 right after the check
            # job's ranks printed): retried, not refused.
            kind = FailureKind.SCHEDULER_BUSY if "in use" in text else kind_from_text(text)
            raise ReboundError(kind, f"scontrol delete ReservationName={name}: {text}")

    async def submit_check(self, request: CheckJobRequest) -> int:
        args = [
            "--parsable", f"--job-name=rebound-check-{request.node}", f"--nodelist={request.node}", "--nodes=1",
            f"--ntasks={request.ranks}", f"--reservation={request.reservation}", f"--time={request.time_limit_min}",
            "--no-requeue", "--exclusive", f"--comment={request.comment}", f"--output={request.output}",
        ]  # fmt: skip
        if request.gpus:
            args.append(f"--gres=gpu:{request.gpus}")
        result = await self._cli.run("sbatch", *args, stdin=check_script(request.command, request.ranks))
        out = result.stdout.decode("utf-8", "replace").strip()
        first = out.split(";", 1)[0]
        if result.returncode != 0 or not first.isdigit():
            text = result.stderr.strip() or out or f"exited {result.returncode}"
            raise ReboundError(kind_from_text(text), f"sbatch (node check of {request.node}): {text[:300]}")
        return int(first)

    async def cancel(self, job_id: int) -> None:
        await self._checked("scancel", str(job_id))

    async def _checked(self, tool: str, *args: str) -> None:
        result = await self._cli.run(tool, *args)
        if result.returncode != 0:
            text = (result.stderr.strip() or result.stdout.decode("utf-8", "replace").strip())[:300]
            raise ReboundError(kind_from_text(text), f"{tool} {' '.join(args[:3])}: {text}")


def _read_kind(text: str) -> FailureKind:
    kind = kind_from_text(text)
    # A read that fails for a reason we cannot name is retried: reading twice does no harm.
    return FailureKind.SCHEDULER_UNREACHABLE if kind is FailureKind.SCHEDULER_REJECTED else kind
