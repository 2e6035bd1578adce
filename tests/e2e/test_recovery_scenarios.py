"""End to end on the test lab: break a real training job four ways and watch Rebound keep it making progress.

Each test submits the demo (2 nodes x 2 ranks, a checkpoint every 10 steps) opted in through its Slurm comment,
so the lab's own worker starts its JobRecovery; waits for a checkpoint; injects one fault with its true onset
(t0); and follows the workflow's ``status`` query until the job trains again (or Rebound gives up on a user
bug). Every claim of the workflow is checked against Slurm (fresh ``sinfo``/``squeue``, slurmctld's log) and
against the job's own logs. The detection latency (detected_at - t0) is printed.

The last two tests pin down bugs these tests found (a cancel during the resume wait; an old XID blamed).
"""

from __future__ import annotations

import asyncio

import pytest

from deploy.demo.inject import inject
from deploy.local.fake_nvml_state import append_xid
from tests.e2e.recovery_support import (
    assert_recovered_once,
    baseline,
    incident_of,
    latency_report,
    monitored_demo,
    sinfo_drains,
    slurm_job,
)
from tests.lab_support import LabHandle
from workflows.domain.incident import ActionRung, FailureClass
from workflows.domain.recovery import RecoveryState
from workflows.domain.slurm import JobState

pytestmark = pytest.mark.slow


async def test_rank_crash_excludes_its_node_drains_nothing_and_resumes_elsewhere(lab: LabHandle) -> None:
    """A rank that exits on its own is only the job's word against its node: the job restarts excluding the node,
    the Fleet records a suspicion, nothing is drained (docs/failure-taxonomy.md, the action ladder)."""
    async with monitored_demo(lab, "crash") as (job, rec):
        base = await baseline(lab, job)
        record = inject(lab.layout, "crash", run=job.run, rank=3)
        assert record.node in base.nodes

        st = await rec.wait_resumed(timeout_s=60)
        inc = await assert_recovered_once(lab, rec, base, bad_node=record.node, drained=False)
        att = inc.attribution
        assert att is not None and att.action is ActionRung.EXCLUDE, att
        excluded = [e.detail for e in st.timeline if e.event == "EXCLUDED" and e.incident == inc.number]
        assert excluded and excluded[0].startswith(f"excluded {record.node} from job {job.job_id}'s next placement")
        assert excluded[0].endswith("suspicion recorded"), excluded
        print(latency_report("rank crash", st, inc, record.t0_epoch))


async def test_node_crash_drains_the_dead_node_and_resumes_elsewhere(lab: LabHandle) -> None:
    async with monitored_demo(lab, "nodecrash") as (job, rec):
        base = await baseline(lab, job)
        slurm = await slurm_job(lab, job.job_id)
        node = next(n for n in base.nodes if n != slurm.batch_host)  # the batch script's node stays up
        try:
            record = inject(lab.layout, "node-crash", node=node, run=job.run)
            st = await rec.wait_resumed(timeout_s=75)
            inc = await assert_recovered_once(lab, rec, base, bad_node=node)
            print(latency_report("node crash", st, inc, record.t0_epoch))
        finally:
            lab.lab.slurm.start()  # the "host" reboots: its slurmd registers again (still drained)


async def test_xid_79_drains_the_gpus_node_and_resumes_elsewhere(lab: LabHandle) -> None:
    async with monitored_demo(lab, "xid") as (job, rec):
        base = await baseline(lab, job)
        try:
            record = inject(lab.layout, "gpu-fault", run=job.run, rank=1, xid=79)
            assert record.node is not None
            node = record.node
            st = await rec.wait_resumed(timeout_s=60)
            inc = await assert_recovered_once(lab, rec, base, bad_node=node)
            att = inc.attribution
            assert att is not None and att.failure_class is FailureClass.HARDWARE and "79" in att.cause, att
            assert any(g.startswith(f"{node}:") for g in att.implicated_gpus), att.implicated_gpus
            print(latency_report("XID 79", st, inc, record.t0_epoch))
        finally:
            for n in base.nodes:  # the XID was appended to the node's fake NVML state: repair the "hardware"
                lab.lab.rebound.reset_gpus(n)


async def test_user_bug_gives_up_without_draining_anything(lab: LabHandle) -> None:
    async with monitored_demo(lab, "userbug") as (job, rec):
        base = await baseline(lab, job)
        record = inject(lab.layout, "user-bug", run=job.run, rank="all")
        st = await rec.wait(lambda s: s.state is RecoveryState.GAVE_UP, 60, "JobRecovery giving up")
        inc = incident_of(st)
        assert inc is not None and len(st.incidents) == 1, rec.describe()
        att = inc.attribution
        assert att is not None and att.failure_class is FailureClass.USER and not att.retryable, att
        assert att.evidence and any("ValueError" in ev.text for ev in att.evidence), att.evidence
        assert not inc.actions, inc.actions
        assert inc.restarted_at is None and inc.resumed_at is None

        assert not sinfo_drains(lab), sinfo_drains(lab)
        assert base.ctld.drains() == [] and base.ctld.requeues(job.job_id) == 0
        after = await slurm_job(lab, job.job_id)
        assert after.restart_count == base.restart_count
        assert after.state is not JobState.PENDING, after
        print(latency_report("user bug", st, inc, record.t0_epoch))
        for ev in att.evidence[:3]:
            print(f"  evidence [{ev.source.value} {ev.node} rank {ev.rank}] {ev.text[:120]}")


async def test_owner_cancel_while_waiting_for_the_resume_ends_the_recovery(lab: LabHandle) -> None:
    async with monitored_demo(lab, "cancel-verify") as (job, rec):
        inject(lab.layout, "crash", run=job.run, rank=3)
        await rec.wait(lambda s: s.state is RecoveryState.VERIFYING, 30, "VERIFYING", interval_s=0.05)
        held = await slurm_job(lab, job.job_id)
        assert held.state is JobState.PENDING, held  # requeued, not started yet (cred_expire hold)
        lab.slurm("scancel", str(job.job_id))
        st = await rec.wait(lambda s: s.state.is_terminal(), 20, "the recovery ending after the owner's cancel")
        assert st.state is RecoveryState.FINISHED, rec.describe()


async def test_an_operators_requeue_is_not_an_incident_and_an_old_xid_is_not_blamed(lab: LabHandle) -> None:
    node = lab.nodes[0]
    try:
        append_xid(lab.layout.nvml_state(node), 0, 79)  # on a node with no job: the agent records it, nobody else
        await asyncio.sleep(1.5)
        lab.lab.rebound.reset_gpus(node)  # and the GPU is repaired before the job starts
        demo = monitored_demo(lab, "stale-xid", extra_sbatch_args=[f"--nodelist={node}"], checkpoint=False)
        async with demo as (job, rec):
            assert node in (await slurm_job(lab, job.job_id)).nodes
            lab.slurm("scontrol", "requeue", str(job.job_id))  # an operator requeues it: nothing is at fault
            st = await rec.wait(lambda s: any(e.event == "REQUEUED" for e in s.timeline), 30, "the requeue recorded")
            await asyncio.sleep(3)  # give a wrong incident every chance to appear
            st = await rec.wait(lambda s: True, 10, "a status")
            assert not st.incidents, rec.describe()
            assert st.restarts_used == 0
            assert not (lab.slurm("sinfo", "-h", "-N", "-o", "%N %E").count("rebound:")), "nothing may be drained"
    finally:
        lab.lab.rebound.reset_gpus(node)
