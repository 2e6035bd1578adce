"""Helpers of the chaos tests (``test_chaos.py``): take one part of the lab down and bring it back, watch what
Rebound does meanwhile, count what it should not have done.

The outage lasts ``$REBOUND_CHAOS_OUTAGE_S`` seconds (15 in ``make test``; ``rebound bench chaos`` runs 60).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowExecutionStatus

from deploy.local.processes import is_alive, kill_and_wait
from tests.e2e.recovery_support import Recovery, sinfo_drains
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.fleet_cli import fleet_status
from workflows.constants import fleet_workflow_id
from workflows.domain.fleet import FleetStatus, NodeLifecycle
from workflows.domain.recovery import JobRecoveryStatus

#: Seconds each part stays down (measured and reported: the real outage includes the stop and the start).
OUTAGE_S = float(os.environ.get("REBOUND_CHAOS_OUTAGE_S", "15"))

#: Node states in which Rebound has drained (or is draining) a node.
DRAINING = (NodeLifecycle.DRAINING, NodeLifecycle.DRAINED, NodeLifecycle.HELD)


# ----- slurmctld --------------------------------------------------------------------------------------------------
def stop_slurmctld(lab: LabHandle) -> None:
    """Stop the lab's slurmctld only (SIGTERM: it saves its state, as a controller restart would); the slurmd
    daemons, slurmrestd and every job step keep running."""
    slurm = lab.lab.slurm
    pid = slurm.pid("slurmctld")
    assert pid is not None, "slurmctld is not running"
    kill_and_wait([pid])
    lab.layout.pid_file("slurmctld").unlink(missing_ok=True)
    assert slurm.pid("slurmctld") is None


def start_slurmctld(lab: LabHandle) -> None:
    """Start slurmctld again from its saved state (the lab's start starts only what is missing) and wait until it
    answers and every node registered."""
    lab.lab.slurm.start()


def ctld_answers(lab: LabHandle) -> bool:
    try:
        return "is UP" in lab.slurm("scontrol", "ping", check=False)
    except Exception:  # the CLI's own timeout
        return False


# ----- node agents ------------------------------------------------------------------------------------------------
def agent_service(lab: LabHandle, node: str) -> str:
    return next(service for service, nodes in lab.cfg.agent_groups() if node in nodes)


def sigkill_agent(lab: LabHandle, node: str) -> int:
    """SIGKILL the node agent serving ``node`` (a crash: no graceful shutdown, its poller just vanishes)."""
    service = agent_service(lab, node)
    pid = lab.lab.rebound.pid(service)
    assert pid is not None, f"{service} is not running"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_alive(pid)
    lab.layout.pid_file(service).unlink(missing_ok=True)
    return pid


# ----- what Rebound said during and after -------------------------------------------------------------------------
async def fleet_or_none(client: Client, lab: LabHandle) -> FleetStatus | None:
    """The running Fleet's status; None when no Fleet runs (no request since the test began) or none answers now.

    A terminated Fleet still answers queries (Temporal replays its history): the fixture ends each test's Fleet,
    so the last run may be an earlier test's or session's, with its nodes; only a running one is this test's."""
    settings = lab_rebound_settings(lab)
    with contextlib.suppress(Exception):
        handle = client.get_workflow_handle(fleet_workflow_id(settings.cluster_name))
        described = await asyncio.wait_for(handle.describe(), timeout=5)
        if described.status is not WorkflowExecutionStatus.RUNNING:
            return None
        return await asyncio.wait_for(fleet_status(client, settings), timeout=5)
    return None


def rebound_drained(fleet: FleetStatus | None) -> list[str]:
    """Nodes the Fleet drained, is draining or holds (none when there is no Fleet)."""
    if fleet is None:
        return []
    return sorted(n for n, rec in fleet.state.nodes.items() if rec.state in DRAINING)


@dataclass
class Watcher:
    """Polls one job's status query and a fresh ``sinfo`` every second while something is down: what an operator
    would see, and any action taken meanwhile."""

    lab: LabHandle
    rec: Recovery
    answers: int = 0
    no_answer: int = 0
    incidents_seen: int = 0
    drains_seen: dict[str, str] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    async def poll(self) -> JobRecoveryStatus | None:
        st = await self.rec.query()
        if st is None:
            self.no_answer += 1
        else:
            self.answers += 1
            self.incidents_seen = max(self.incidents_seen, len(st.incidents))
            label = f"{st.state.value}/{st.job_state.value if st.job_state else '?'}"
            if not self.states or self.states[-1] != label:
                self.states.append(label)
            if st.note and (not self.notes or self.notes[-1] != st.note):
                self.notes.append(st.note)
        with contextlib.suppress(Exception):  # sinfo itself fails while slurmctld is down
            self.drains_seen.update(sinfo_drains(self.lab))
        return st

    async def during(self, seconds: float, extra: Callable[[float], Awaitable[None]] | None = None) -> None:
        """Poll for ``seconds``; ``extra(elapsed)`` runs after each poll."""
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            await self.poll()
            if extra is not None:
                await extra(elapsed)
            await asyncio.sleep(max(0.0, min(1.0, seconds - (time.monotonic() - start))))

    def summary(self) -> str:
        return (
            f"status answered {self.answers}x, not {self.no_answer}x; states {' > '.join(self.states) or '-'}; "
            f"notes {' | '.join(self.notes)[:300] or '-'}"
        )
