"""What every lab benchmark runs with (``BenchContext``), and the reads and waits they share (I/O).

A benchmark holds the lab, a Temporal client and the lab's Rebound settings; through them it runs Slurm commands,
reads node and job states, queries a job's JobRecovery, and brings the lab back to a clean start between runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from deploy.bench.labparse import NodeRow, parse_sinfo_nodes
from deploy.bench.scenarios import SCENARIOS, XID, Scenario, pick_target
from deploy.local.processes import LabError, run
from workflows.constants import is_rebound_drain
from workflows.domain.base import Frozen
from workflows.domain.recovery import JobRecoveryStatus

if TYPE_CHECKING:
    from temporalio.client import Client

    from deploy.demo.common import FaultKind
    from deploy.demo.injections import InjectionRecord
    from deploy.local.lab import Lab
    from workers.settings import Settings

__all__ = [
    "ENDED_STATES",
    "INJECTED",
    "LIVE_STATES",
    "STATE_UNKNOWN",
    "BenchContext",
    "BenchError",
    "BenchOptions",
    "read_lines",
    "say",
    "until",
    "write_json_report",
]

#: What each fault of the lab benchmarks (``rebound bench recovery`` scenarios, ``rebound bench launchers``
#: faults) injects (``rebound lab inject`` kinds): into the target rank (``pick_target``), its node for
#: ``node-crash``, every rank for ``user-bug``.
INJECTED: dict[str, FaultKind] = {
    "rank-crash": "crash",
    "rank-kill": "kill",
    "xid": "gpu-fault",
    "hang": "hang",
    "node-crash": "node-crash",
    "user-bug": "user-bug",
}


#: ``BenchContext.job_state`` when squeue failed: not a state, look again.
STATE_UNKNOWN = "UNKNOWN"
#: States of a job that will not train again (``""``: Slurm no longer lists it).
ENDED_STATES = ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
#: States of a job on its way to train (or training), and the unknown one, which is looked at again.
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", STATE_UNKNOWN)


class BenchOptions(Frozen):
    scenarios: tuple[Scenario, ...] = SCENARIOS
    repeat: int = Field(3, ge=1, le=100)
    run_timeout_s: float = Field(180.0, gt=0)
    """From the injection to the outcome (resumed, or the workflow ended)."""
    warmup_steps: int = Field(30, ge=1)
    """Inject only once rank 0 logged this step and saved a checkpoint."""
    setup_timeout_s: float = Field(120.0, gt=0)
    """For each wait before the fault: monitored, training, and the lab clean again after a run."""
    poll_s: float = Field(1.0, gt=0)


class BenchError(RuntimeError):
    """A run could not be set up or measured; the message says which step and why."""


def say(msg: str) -> None:
    """A progress line on stderr (stdout carries the results)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_json_report(path: str | Path, report: Any) -> None:
    """A bench's JSON report, its directory made; says where it went."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def read_lines(path: Path) -> list[str]:
    """The file's lines; none while it does not exist yet."""
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


async def until(what: str, timeout_s: float, poll_s: float, check: Callable[[], Awaitable[object]]) -> None:
    """Poll the async ``check`` until it returns something truthy.

    Raises:
        BenchError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() >= deadline:
            raise BenchError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


@dataclass
class BenchContext:
    """The lab, a Temporal client and the lab's settings, for one benchmark session."""

    lab: Lab
    client: Client
    settings: Settings
    opts: BenchOptions

    def slurm(self, *argv: str, timeout: float = 15.0) -> str:
        """Run a Slurm command against the lab; its stdout."""
        return run(list(argv), env=self.lab.slurm.env(), timeout=timeout)

    def nodes(self) -> list[NodeRow]:
        """Every lab node's state and reason, as ``sinfo`` shows them now."""
        return parse_sinfo_nodes(self.slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E"))

    def job_state(self, job_id: int) -> str:
        """squeue's state of the job; ``""`` once Slurm no longer lists it, ``STATE_UNKNOWN`` when squeue itself
        failed (a busy slurmctld times out now and then on a loaded machine: a failed lookup is not a state, the
        caller looks again)."""
        try:
            out = self.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
        except LabError as e:
            if "Invalid job id" in str(e):
                return ""
            say(f"squeue of job {job_id} failed, looking again: {e}")
            return STATE_UNKNOWN
        return out.split()[0] if out else ""

    async def status(self, job_id: int) -> JobRecoveryStatus | None:
        """The job's JobRecovery status; None while it does not exist yet or does not answer (polling tries again)."""
        from temporalio.client import WorkflowQueryFailedError
        from temporalio.service import RPCError

        from workers.jobs_cli import query_status
        from workflows.domain.errors import ReboundError

        try:
            return await query_status(self.client, self.settings, job_id)
        except (ReboundError, RPCError, WorkflowQueryFailedError) as e:
            if not isinstance(e, ReboundError):
                say(f"status query of job {job_id} failed: {e}")
            return None

    def inject(self, fault: str, run: str) -> InjectionRecord:
        """Inject ``fault`` (a key of ``INJECTED``) into ``run``'s target rank (``pick_target``) or its node.

        Raises:
            ValueError: an unknown fault, or no target (every rank on rank 0's node).
            InjectionError: the injection failed.
        """
        from deploy.demo.inject import inject
        from deploy.demo.injections import live_ranks

        kind = INJECTED.get(fault)
        if kind is None:
            raise ValueError(f"unknown bench fault {fault!r}: choose from {', '.join(INJECTED)}")
        layout = self.lab.cfg.layout
        if kind == "user-bug":
            return inject(layout, kind, run=run, rank="all")
        target = pick_target(live_ranks(layout, run))
        if kind == "node-crash":
            return inject(layout, kind, run=run, node=target.node)
        return inject(layout, kind, run=run, rank=target.rank, xid=XID)

    async def prepare_lab(self, *, crashed_node: str | None = None) -> None:
        """Lab up (restarts a crashed node's slurmd), Rebound's drains resumed, every node idle."""
        await self.restore_nodes(crashed_node=crashed_node)

        async def idle() -> bool:
            rows = self.nodes()
            return {r.node for r in rows if r.state == "idle"} >= set(self.lab.cfg.node_names)

        try:
            await until("every lab node idle", self.opts.setup_timeout_s, self.opts.poll_s, idle)
        except BenchError as e:
            states = ", ".join(f"{r.node}={r.state}{' (' + r.reason + ')' if r.reason else ''}" for r in self.nodes())
            raise BenchError(f"{e}: {states}") from None

    async def restore_nodes(self, *, crashed_node: str | None = None) -> None:
        """What an operator does after a fault: the lab up (a crashed node's slurmd again), Rebound's drains
        resumed, the breaker closed. Running jobs are left alone."""
        await asyncio.to_thread(self.lab.up, log=False)
        self._resume_nodes(crashed_node)
        await self._reset_breaker()

    async def _reset_breaker(self) -> None:
        """Each run starts with a closed breaker, as an operator would reset it after lifting the previous drains."""
        from temporalio.service import RPCError

        from workers.fleet_cli import reset_breaker
        from workflows.domain.errors import ReboundError

        try:
            await reset_breaker(self.client, self.settings)
        except (ReboundError, RPCError) as e:  # no Fleet yet (first run): nothing to reset
            say(f"breaker not reset: {e}")

    def _resume_nodes(self, crashed_node: str | None) -> None:
        for row in self.nodes():
            if is_rebound_drain(row.reason) or (row.node == crashed_node and row.state != "idle"):
                try:
                    self.slurm("scontrol", "update", f"nodename={row.node}", "state=resume")
                    say(f"resumed {row.node} (was {row.state}: {row.reason or '-'})")
                except LabError as e:
                    say(f"could not resume {row.node}: {e}")
