"""A rank crash while the scheduler does not answer (the workflow-level twin of ``tests/e2e/test_chaos.py``'s
slurmctld scenarios): nothing is decided on a guess. The watch needs the scheduler's snapshot with the log lines,
so the incident is opened only once the scheduler answers again (attribution, the job's state, the Fleet's view
and the requeue all need it; the reads' retries are bounded, the actions' last through hours of outage:
``tests/unit/domain/test_cluster_action_retries.py``); then it is recovered once, and the JobRecovery never ends
meanwhile.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio.client import WorkflowExecutionStatus

from tests.workflows.test_job_recovery import Harness, _actions, h, until  # noqa: F401 (h: the fixture)
from workflows.domain.incident import ActionKind
from workflows.domain.recovery import RecoveryState
from workflows.job_recovery import JobRecoveryWorkflow

#: Longer than every bounded retry on the way (attribution: 3 tries in ~3 s, scheduler reads: 5 in ~15 s).
OUTAGE_S = 20


async def test_a_crash_during_a_scheduler_outage_waits_for_it_and_recovers_once(h: Harness) -> None:  # noqa: F811
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    h.step(job.job_id, 0, 7, h.nodes[0])

    h.sched.unreachable = True
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.log(job.job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job.job_id, exit_code=13)
    await asyncio.sleep(OUTAGE_S)
    desc = await handle.describe()
    assert desc.status is WorkflowExecutionStatus.RUNNING, f"the recovery ended during the outage: {desc.status}"
    assert h.sched.jobs[job.job_id].restart_count == 0  # nothing done while slurmctld is away
    during = await handle.query(JobRecoveryWorkflow.status)
    assert during.state is RecoveryState.WATCHING and not during.incidents, during.timeline  # the watch waits too

    h.sched.unreachable = False
    st = await until(handle, lambda s: s.state is RecoveryState.VERIFYING, timeout=40)
    assert len(st.incidents) == 1, st.incidents
    assert _actions(st, ActionKind.REQUEUE) == [str(job.job_id)] and _actions(st, ActionKind.DRAIN) == []
    assert h.sched.jobs[job.job_id].restart_count == 1
