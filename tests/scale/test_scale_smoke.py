"""Issue 12's guard in ``make test``: a small version of ``rebound bench scale`` proving that a recovery proceeds
while every job is being watched, so the activity-slot ceiling (about 100 watched jobs per worker, ADR 015) cannot
come back unnoticed.

200 opted-in jobs (twice the SDK's default 100 activity slots) on the benchmark's synthetic cluster
(``deploy/scale``: fake ``squeue``/``sinfo``/``scontrol`` behind ``slurm.bin_dir``, a log writer on ``/dev/shm``)
in front of the real processes: a Temporal dev server of its own (free ports, no lab lock), the node agents and one
``rebound worker`` with production settings (only its Prometheus port is chosen, to read its shard gauges). The test
waits until every job has a JobRecovery and all 200 are members of the shard hubs (the workers'
``rebound_watch_shard_members`` gauges), crashes one job and puts an XID on another's node, and asserts both are
detected and requeued by the scheduler, while the other 198 stay watched with no incident. With the per-job watches
and the SDK's 100 activity slots (``watch.hub=false``, ``temporal.max_concurrent_activities=100``) it fails: the
jobs are never all watched.

Bounds only, all generous (the machine is shared): no latency is asserted beyond them.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from deploy.scale.faults import FaultKind, InjectedFault, PlannedFault
from deploy.scale.reads import incidents, wait_hub_members, wait_watched
from deploy.scale.reads import statuses as read_statuses
from deploy.scale.run import inject, scale_cluster
from deploy.scale.score import score
from workflows.domain.recovery import RecoveryState

#: The bounds below add up to more than the suite's 300 s per test; a failing run must reach its own message.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOBS = 200
#: Two ranks a job (the bench's default is 8): the watch path is the same per file, the writer's load a quarter.
RANKS = 2
#: Every job has a JobRecovery and is a hub member within this (measured 77 to 175 s on the shared 2-core machine,
#: load 7 to 16: the dev server starting 300 workflows is most of it).
WATCHED_WITHIN_S = 420.0
#: Both faults detected and their requeue verified by the scheduler within this (seconds of the injection).
RECOVERED_WITHIN_S = 120.0


async def test_recovery_proceeds_while_every_job_is_watched() -> None:
    async with scale_cluster(
        JOBS,
        ranks=RANKS,
        spare_nodes=8,
        push_poll_s=0.5,
        log_budget_mb=512,
        stop_timeout_s=3.0,  # nothing to keep: a process not gone by then is killed
    ) as run:
        started = time.monotonic()
        recovering = await wait_watched(run.client, JOBS, run.stack, timeout_s=WATCHED_WITHIN_S)
        assert recovering == JOBS, f"only {recovering} of {JOBS} jobs got a JobRecovery in {WATCHED_WITHIN_S:.0f} s"
        left = max(10.0, WATCHED_WITHIN_S - (time.monotonic() - started))
        members = await wait_hub_members(run.stack, JOBS, left)
        assert members == JOBS, f"the shard hubs watch {members} of {JOBS} jobs after {WATCHED_WITHIN_S:.0f} s"
        watched_after = time.monotonic() - started

        crash_job, xid_job, *others = sorted(run.cluster.jobs)
        injected: list[InjectedFault] = []
        plan = [
            PlannedFault(kind=FaultKind.CRASH, job_id=crash_job, at_s=0.0, target=1),
            PlannedFault(kind=FaultKind.XID, job_id=xid_job, at_s=0.0, target=0),
        ]
        t_inject = time.monotonic()
        await asyncio.gather(*(inject(f, run.fake, run.writer, run.shm / "nvml", injected) for f in plan))
        assert sorted(f.job_id for f in injected) == [crash_job, xid_job]

        deadline = t_inject + RECOVERED_WITHIN_S
        while True:
            found = await incidents(run.client, [crash_job, xid_job], attempts=2)
            outcomes, _, _ = score(injected, found)
            if all(o.action_s is not None for o in outcomes) or time.monotonic() > deadline:
                break
            run.stack.check_alive()
            await asyncio.sleep(2.0)
        recovered_after = time.monotonic() - t_inject
        for outcome in outcomes:
            assert outcome.detected_s is not None, f"{outcome.kind} on job {outcome.job_id} was never detected"
            assert outcome.action_s is not None, (
                f"{outcome.kind} on job {outcome.job_id}: detected after {outcome.detected_s} s, but no recovery "
                f"action verified within {RECOVERED_WITHIN_S:.0f} s"
            )
        requeued = {int(c["argv"][1]) for c in run.fake.commands if c["argv"][:1] in (["requeue"], ["requeuehold"])}
        assert {crash_job, xid_job} <= requeued, f"scheduler requeues seen: {sorted(requeued)}"
        assert run.cluster.jobs[crash_job].restart_count >= 1
        assert run.cluster.jobs[xid_job].restart_count >= 1

        # Every other job: still watched, untouched by the two recoveries, no incident.
        statuses = await read_statuses(run.client, others, attempts=3, timeout_s=60.0)
        assert sorted(statuses) == others, f"{len(others) - len(statuses)} job(s) did not answer their status query"
        not_watching = {j: s.state for j, s in statuses.items() if s.state is not RecoveryState.WATCHING}
        assert not not_watching, f"jobs no longer watching: {dict(list(not_watching.items())[:10])}"
        falsely = {j: [i.anomaly.kind.value for i in s.incidents] for j, s in statuses.items() if s.incidents}
        assert not falsely, f"incidents on jobs no fault touched: {falsely}"
        untouched = [j for j in others if run.cluster.jobs[j].restart_count]
        assert not untouched, f"jobs restarted that no fault touched: {untouched}"
        # ... and the hubs still hold them all (the two recovered jobs subscribe again once they run).
        members = await wait_hub_members(run.stack, JOBS, RECOVERED_WITHIN_S)
        assert members == JOBS, f"after the recoveries the shard hubs watch {members} of {JOBS} jobs"
        print(
            f"\n{JOBS} jobs watched {watched_after:.0f} s after the worker started; crash and XID recovered in "
            f"{recovered_after:.0f} s: {[o.model_dump() for o in outcomes]}"
        )
