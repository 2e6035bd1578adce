"""End to end on the test lab: the node check job before a drained node returns to service (ADR 018).

Each test has the Fleet (started here with short health-check intervals) drain one node, then follows what its
health check does, checked against a fresh ``sinfo``/``squeue`` and ``scontrol show reservation``:

* the check job (a real gloo all-reduce across the node's ranks, in a maintenance reservation) passes: resumed;
* the node's last rank never joins the all-reduce (only the check job can see this: the node agent's GPU read
  passes): held for repair, Slurm's reason naming the check's job, the job cancelled;
* Slurm's own HealthCheckProgram (the lab's NHC stand-in) drains the node meanwhile: its reason stays, the node is
  not resumed and no check job runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime

import pytest
from temporalio.client import Client

from activities.temporal.rebound_workflows import signal_fleet_request
from deploy.local.node_check_lab import fail_check, fail_nhc
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect
from workers.fleet_cli import fleet_status
from workflows.domain.fleet import FleetInput, FleetMode, FleetPolicy, FleetStatus, IsolationRequest, NodeLifecycle
from workflows.domain.node_check import NodeCheckPolicy, reservation_name

pytestmark = pytest.mark.slow


def _policy(after_s: float) -> FleetPolicy:
    return FleetPolicy(
        mode=FleetMode.ACT,
        health_check_after_s=after_s,
        node_check=NodeCheckPolicy(timeout_s=60, ranks=2, reservation_minutes=10),
    )


async def _drain_through_fleet(lab: LabHandle, client: Client, node: str, policy: FleetPolicy) -> None:
    """Start the Fleet with ``policy`` and have it drain ``node`` (a request as a JobRecovery's, no job to tell)."""
    settings = lab_rebound_settings(lab)
    now = datetime.now(UTC)
    req = IsolationRequest(
        request_id=f"e2e/node-check/{node}/{now.timestamp()}",
        reply_to="",
        job_id=999_000,
        incident="999000-1",
        cause="xid-79",
        confidence=1.0,
        nodes=(node,),
        requested_at=now,
        evidence="e2e: the node check's tests",
    )
    await signal_fleet_request(
        client, FleetInput(cluster=settings.cluster_name, policy=policy), req, task_queue=settings.temporal.task_queue
    )


async def _wait(
    client: Client, lab: LabHandle, node: str, states: tuple[NodeLifecycle, ...], timeout_s: float
) -> FleetStatus:
    settings = lab_rebound_settings(lab)
    deadline = time.monotonic() + timeout_s
    st: FleetStatus | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            st = await fleet_status(client, settings)
            record = st.state.nodes.get(node)
            if record is not None and record.state in states:
                return st
        await asyncio.sleep(0.3)
    raise AssertionError(f"{node} not {[s.value for s in states]} within {timeout_s:.0f} s: {st}")


def _node(lab: LabHandle, node: str) -> dict[str, str]:
    line = lab.slurm("scontrol", "-o", "show", "node", node)
    fields: dict[str, str] = {}
    for tok in line.split():
        key, _, value = tok.partition("=")
        fields.setdefault(key, value)
    fields["Reason"] = line.split("Reason=", 1)[1].split(" [", 1)[0] if "Reason=" in line else ""
    return fields


def _reservation(lab: LabHandle, node: str) -> bool:
    return reservation_name(node) in lab.slurm("scontrol", "show", "reservation", check=False)


def _job_state(lab: LabHandle, job_id: int) -> str:
    out = lab.slurm("squeue", "-h", "-j", str(job_id), "-t", "all", "-o", "%T", check=False).strip()
    return out or "gone"


def _check_job_id(text: str) -> int:
    return int(text.split("check job ", 1)[1].split()[0].rstrip(":"))


def _tidy(lab: LabHandle, node: str) -> None:
    fail_check(lab.cfg.state_dir, node, None)
    fail_nhc(lab.cfg.state_dir, node, None)
    lab.slurm("scontrol", "delete", f"ReservationName={reservation_name(node)}", check=False)


async def test_a_drained_node_whose_check_job_passes_is_resumed(lab: LabHandle) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    node = "n2"
    t0 = time.monotonic()
    try:
        await _drain_through_fleet(lab, client, node, _policy(after_s=1))
        st = await _wait(client, lab, node, (NodeLifecycle.HEALTHY, NodeLifecycle.HELD), 60)
        record = st.state.nodes[node]
        assert record.state is NodeLifecycle.HEALTHY, record
        assert "passed" in record.checks[-1] and "gloo-all-reduce" in record.checks[-1], record.checks
        job_id = _check_job_id(record.checks[-1])
        assert record.drained_at is not None
        # The Fleet records its verdict, then releases the node: wait for the release to show in Slurm.
        lab.wait_for(lambda: not _reservation(lab, node), 30)
        fields = _node(lab, node)
        assert "DRAIN" not in fields["State"], fields
        assert _job_state(lab, job_id) == "COMPLETED", _job_state(lab, job_id)
        print(f"{node}: drained, check job {job_id} passed, resumed in {time.monotonic() - t0:.1f} s")
    finally:
        _tidy(lab, node)


async def test_a_node_whose_ranks_cannot_complete_the_all_reduce_is_held_with_the_job_id(lab: LabHandle) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    node = "n3"
    t0 = time.monotonic()
    try:
        fail_check(lab.cfg.state_dir, node, "hang")  # its GPUs read healthy: only the check job can see this
        await _drain_through_fleet(lab, client, node, _policy(after_s=1))
        st = await _wait(client, lab, node, (NodeLifecycle.HEALTHY, NodeLifecycle.HELD), 90)
        record = st.state.nodes[node]
        assert record.state is NodeLifecycle.HELD, record
        assert "gloo-all-reduce" in record.reason, record.reason
        job_id = _check_job_id(record.reason)
        lab.wait_for(lambda: not _reservation(lab, node), 30)  # drained first, then the reservation goes
        fields = _node(lab, node)
        assert "DRAIN" in fields["State"], fields
        assert fields["Reason"].startswith(f"rebound: held for repair: node check job {job_id} failed"), fields
        assert record.drain_reason.startswith(fields["Reason"][:60]), (record.drain_reason, fields)
        lab.wait_for(lambda: _job_state(lab, job_id) == "CANCELLED", 20)  # scancelled; COMPLETING for KillWait
        print(f"{node}: check job {job_id} failed ({record.reason[:100]}); held in {time.monotonic() - t0:.1f} s")
    finally:
        _tidy(lab, node)


async def test_a_node_drained_by_the_health_check_program_keeps_its_reason_and_is_not_resumed(lab: LabHandle) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    node = "n4"
    t0 = time.monotonic()
    try:
        await _drain_through_fleet(lab, client, node, _policy(after_s=12))
        await _wait(client, lab, node, (NodeLifecycle.DRAINED,), 30)
        fail_nhc(lab.cfg.state_dir, node, "lab: bad DIMM")  # HealthCheckInterval=5: NHC drains it over ours
        lab.wait_for(lambda: _node(lab, node)["Reason"].startswith("NHC: lab: bad DIMM"), 20)
        st = await _wait(client, lab, node, (NodeLifecycle.EXTERNAL, NodeLifecycle.HEALTHY, NodeLifecycle.HELD), 45)
        record = st.state.nodes[node]
        assert record.state is NodeLifecycle.EXTERNAL and "NHC: lab: bad DIMM" in record.reason, record
        fields = _node(lab, node)
        assert "DRAIN" in fields["State"] and fields["Reason"].startswith("NHC: lab: bad DIMM"), fields
        assert not _reservation(lab, node)
        checks = [
            j
            for j in lab.slurm("squeue", "-h", "-t", "all", "-o", "%j %N").splitlines()
            if f"rebound-check-{node}" in j
        ]
        assert not checks, checks
        print(f"{node}: NHC's drain kept, not resumed, no check job ({time.monotonic() - t0:.1f} s)")
    finally:
        _tidy(lab, node)
