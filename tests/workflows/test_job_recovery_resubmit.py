"""Resubmission in JobRecovery (ADR 014): a --no-requeue job whose rank crashed is submitted again as its owner,
off the bad node, exactly once across a lost activity answer, and the one workflow follows the new job."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from activities.slurm.submission import token_in
from activities.temporal.discovery import TemporalJobRecoveryStarter
from activities.temporal.rebound_workflows import lineage_workflow_id, start_job_recovery
from tests.workflows.test_job_recovery import Harness, _actions, h, until
from workers import jobs_cli
from workers.settings import Settings
from workflows.constants import JOB_ID, job_workflow_id
from workflows.domain.discovery import StartJobRecoveryInput
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.incident import ActionKind
from workflows.domain.recovery import JobRecoveryInput, RecoverySpec, RecoveryState
from workflows.domain.slurm import JobState

__all__ = ["h"]  # the fixture, shared with test_job_recovery


def _crash(h: Harness, job_id: int) -> None:
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job_id, exit_code=13)


async def test_no_requeue_job_is_resubmitted_once_and_followed(h: Harness) -> None:
    old = h.sched.submit(h.nodes[:2], name="llm", requeue=False, comment="rebound", user_id=1000)
    h.sched.scripts[old.job_id] = b"#!/bin/bash\nsrun python train.py\n"
    handle = await h.start(old.job_id)
    st = await until(handle, lambda s: any(e.event == "CAPTURE" for e in s.timeline))
    assert "captured" in next(e.detail for e in st.timeline if e.event == "CAPTURE")
    h.step(old.job_id, 0, 7, h.nodes[0])

    h.sched.lose_submit_answer = 1  # sbatch goes through, the activity's answer is lost: the retry must adopt
    _crash(h, old.job_id)
    st = await until(handle, lambda s: len(s.lineage) == 2 and s.state is RecoveryState.VERIFYING, timeout=40)

    new_id = st.lineage[1]
    assert st.lineage == (old.job_id, new_id) and st.job_id == new_id
    carrying = [j for j in h.sched.jobs.values() if token_in(j.comment)]
    assert [j.job_id for j in carrying] == [new_id] and len(h.sched.submitted) == 1
    new = h.sched.jobs[new_id]
    assert new.user_id == 1000 and h.nodes[1] in new.excluded_nodes and not new.requeue_allowed
    assert st.resubmit_tokens == ()  # resolved: the new job is in the lineage
    assert _actions(st, ActionKind.RESUBMIT) == [str(old.job_id)] and st.restarts_used == 1
    assert any("adopted" in e.detail for e in st.timeline if e.event == "RESUBMITTED")
    assert (await handle.describe()).typed_search_attributes.get(JOB_ID) == str(new_id)

    h.sched.schedule()
    assert h.sched.jobs[new_id].state is JobState.RUNNING and h.nodes[1] not in h.sched.jobs[new_id].nodes
    h.step(new_id, 0, 8, h.sched.jobs[new_id].nodes[0])
    st = await until(handle, lambda s: s.state is RecoveryState.WATCHING and s.incidents[-1].resumed_at is not None)
    h.sched.finish_job(new_id)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result.state is RecoveryState.FINISHED and result.job_id == new_id


async def test_a_job_without_a_captured_submission_gives_up_clearly(h: Harness) -> None:
    old = h.sched.submit(h.nodes[:2], requeue=False, user_id=1000)
    h.sched.fail_next("read_submission", FailureKind.SCHEDULER_REJECTED)  # Slurm kept no script
    handle = await h.start(old.job_id)
    await until(handle, lambda s: any(e.event == "CAPTURE" for e in s.timeline))
    _crash(h, old.job_id)
    result = await asyncio.wait_for(handle.result(), 30)
    assert result.state is RecoveryState.GAVE_UP and "not captured" in result.reason
    assert h.sched.submitted == []


async def test_cluster_watch_starts_no_second_workflow_and_a_comment_claims_nothing(h: Harness) -> None:
    old = h.sched.submit(h.nodes[:2], name="llm", requeue=False, comment="rebound", user_id=1000)
    owner = job_workflow_id(h.cluster, old.job_id)
    spec = RecoverySpec(logs=(str(h.tmp / "job-%j-*.log"),))
    inp = JobRecoveryInput(cluster=h.cluster, job_id=old.job_id, poll_interval_s=0.1, spec=spec)
    handle = await start_job_recovery(h.client, inp, task_queue=h.task_queue, opted_in=True)
    assert handle.id == owner
    await until(handle, lambda s: any(e.event == "CAPTURE" for e in s.timeline))
    _crash(h, old.job_id)
    st = await until(handle, lambda s: len(s.lineage) == 2, timeout=40)
    new_id = st.lineage[1]
    token = token_in(h.sched.jobs[new_id].comment) or ""

    starter = TemporalJobRecoveryStarter(h.client, task_queue=h.task_queue)
    joined = await starter(StartJobRecoveryInput(cluster=h.cluster, job_id=new_id, spec=spec, resubmit_token=token))
    assert joined.lineage and joined.workflow_id == owner
    # The same lookup routes a node agent's GPU fault on the new job to the lineage's workflow.
    assert await lineage_workflow_id(h.client, h.cluster, new_id, token, timeout_s=10) == owner
    # `rebound status <new id>` finds the lineage through its ReboundJobId (visibility is eventually consistent).
    settings = Settings(cluster_name=h.cluster)
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            found = await jobs_cli.query_status(h.client, settings, new_id)
            break
        except ReboundError:
            assert asyncio.get_running_loop().time() < deadline, "rebound status <new id> never found the lineage"
            await asyncio.sleep(0.5)
    assert found.lineage == (old.job_id, new_id)

    # Another job of the user with the token copied into its comment belongs to nobody's lineage: it is started.
    forged = h.sched.submit(h.nodes[2:3], comment=f"rebound |rb-resubmit={token}", user_id=1000)
    started = await starter(
        StartJobRecoveryInput(cluster=h.cluster, job_id=forged.job_id, spec=spec, resubmit_token=token)
    )
    assert not started.lineage and started.workflow_id == job_workflow_id(h.cluster, forged.job_id)
    assert await lineage_workflow_id(h.client, h.cluster, forged.job_id, token, timeout_s=10) is None
    # A token naming a lineage Rebound never had claims nothing either.
    other = h.sched.submit(h.nodes[3:4], comment="rebound |rb-resubmit=999999.1.0000000000000000", user_id=1000)
    started = await starter(
        StartJobRecoveryInput(
            cluster=h.cluster, job_id=other.job_id, spec=spec, resubmit_token="999999.1.0000000000000000"
        )
    )
    assert not started.lineage
    for job_id in (forged.job_id, other.job_id):
        await h.client.get_workflow_handle(job_workflow_id(h.cluster, job_id)).terminate("test over")
    await handle.terminate("test over")
