"""Red team, signals: anyone who reaches the lab's Temporal (here: a raw client straight to the dev server, as any
local user could) forges the messages Rebound's own processes send. Each outcome is checked by a fresh observation:
``sinfo`` through the scheduler, the Fleet's and the job's status queries."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from temporalio.client import Client

from activities.temporal import rebound_workflows
from tests.e2e.recovery_support import Recovery, slurm_job, submit_tracked_demo
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.client import connect
from workers.fleet import start_fleet
from workflows.constants import GPU_FAULT_REPORTED_SIGNAL, REQUEST_ISOLATION_SIGNAL, fleet_workflow_id
from workflows.domain.fleet import IsolationRequest
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.domain.incident import ActionRung

pytestmark = [pytest.mark.lab]


async def _drained(lab: LabHandle) -> set[str]:
    states = lab.lab.slurm.node_states()
    return {n for n, s in states.items() if "drain" in s or "drng" in s}


async def test_forged_requests_and_gpu_faults_touch_nothing(security_lab: LabHandle) -> None:
    lab = security_lab
    settings = lab_rebound_settings(lab)
    client: Client = await connect(settings.temporal)
    await start_fleet(client, settings)
    job = submit_tracked_demo(lab, "redteam-signals", nodes=1, tasks_per_node=1)
    try:
        rec = Recovery(lab, client, job)
        await rec.wait_watching(timeout_s=60)
        mine = (await slurm_job(lab, job.job_id)).nodes
        other = next(n for n in lab.nodes if n not in mine)
        before = await _drained(lab)

        # 1. A drain request "from" the job, naming a node it does not run on, claiming node-level evidence and
        #    another owner.
        forged = IsolationRequest(
            request_id=f"forged/{job.job_id}/1",
            reply_to="",  # nobody waits
            job_id=job.job_id,
            partition="",
            incident=f"{job.job_id}-99",
            cause="xid-79",
            confidence=0.99,
            nodes=(other,),
            requested_at=datetime.now(UTC),
            rung=ActionRung.DRAIN,
            evidence="the node agent read a GPU fault",
            user="alice",
        ).model_copy(update={"reply_to": rec.workflow_id})  # as the job's own workflow would
        await client.get_workflow_handle(fleet_workflow_id(lab.cfg.cluster_name)).signal(
            REQUEST_ISOLATION_SIGNAL, forged
        )
        # 2. A GPU fault "from" the job's node agent that the agent never saw.
        fault = GpuEvent(kind=GpuEventKind.XID, host=mine[0], index=0, xid=79, observed_at=datetime.now(UTC),
                         sequence=424242, source="forged")  # fmt: skip
        await client.get_workflow_handle(rec.workflow_id).signal(GPU_FAULT_REPORTED_SIGNAL, fault)

        st = await rec.wait_timeline("GPU_CLAIM", "forged?", timeout_s=60)
        await asyncio.sleep(3)
        fleet = await rebound_workflows.query_fleet_status(client, lab.cfg.cluster_name, timeout_s=10)
        decision = next(d for d in fleet.state.decisions if d.request_id == forged.request_id)
        assert decision.drained == () and other not in decision.exclude, decision
        assert any(other in r and "not in job" in r for r in decision.reasons), decision.reasons
        record = fleet.state.nodes.get(other)  # the lab's Fleet may remember earlier tests' incidents there
        forged_there = [i for i in (record.incidents if record else ()) if i.request_id == forged.request_id]
        assert not forged_there, "a forged request left an incident on a foreign node"
        assert await _drained(lab) == before, "a forged signal drained a node"
        st = await rec.query() or st
        assert not st.incidents and st.paused_by == "", "a forged GPU fault started an incident"
        assert (await slurm_job(lab, job.job_id)).restart_count == 0
    finally:
        lab.cleanup()
