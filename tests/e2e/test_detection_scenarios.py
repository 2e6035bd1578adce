"""End to end on the test lab: failures that never exit, and a fault only the GPU reports.

* A rank that hangs (blocks in its own code; its peers wait in the all_reduce): Rebound sees that no rank made
  progress for the job's learned window, dumps every rank's stack before touching anything, names the rank
  that stopped first and the one whose stack differs, and restarts the job. Nothing is drained: a hang alone
  does not prove the node bad.
* A rank that slows down (extra time before the collective): its node is reported within 10 steps, and the job
  is left alone (report-only is the default action).
* An XID that no rank ever prints: the node agent's NVML event alone triggers the recovery.

Detection latencies are printed against the injector's true onset (t0).
"""

from __future__ import annotations

import pytest

from deploy.demo.inject import inject
from tests.e2e.recovery_support import (
    STEP,
    assert_recovered_once,
    baseline,
    incident_of,
    latency_report,
    monitored_demo,
    sinfo_drains,
    slurm_job,
)
from tests.lab_support import LabHandle
from workflows.domain.incident import ActionKind, AnomalyKind, EvidenceSource, FailureClass

pytestmark = pytest.mark.slow


async def test_hung_rank_is_detected_within_its_window_dumped_and_restarted(lab: LabHandle) -> None:
    async with monitored_demo(lab, "hang") as (job, rec):
        base = await baseline(lab, job)
        record = inject(lab.layout, "hang", run=job.run, rank=3)
        st = await rec.wait_resumed(timeout_s=90)
        inc = incident_of(st, 1)
        assert inc is not None and inc.anomaly.kind is AnomalyKind.HANG, rec.describe()
        hang = inc.hang
        assert hang is not None, rec.describe()
        latency = inc.detected_at.timestamp() - record.t0_epoch
        # The window is learned from the job's own step times; detection may come one poll after it ends.
        assert latency <= hang.window_s + 5, (latency, hang)
        # The ranks of a synchronous job all stop at the same step: the stacks name the culprit.
        att = inc.attribution
        assert att is not None and att.cause == "hang" and att.implicated_ranks[:1] == (3,), att
        # Evidence was taken before the job was killed: every rank's stack, and rank 3's differs.
        ranks_dumped = {s.rank for s in inc.stacks if s.text}
        assert ranks_dumped == {0, 1, 2, 3}, [(s.rank, s.error) for s in inc.stacks]
        assert 3 in inc.odd_ranks, (inc.odd_ranks, hang)
        # A hang alone proves nothing against the node: no drain, one requeue.
        assert not [a for a in inc.actions if a.kind is ActionKind.DRAIN], inc.actions
        assert not sinfo_drains(lab)
        assert base.ctld.requeues(job.job_id) == 1
        assert job.resumed_and_stepped(base.restart_count + 1) is not None
        print(latency_report("hang", st, inc, record.t0_epoch), f"window {hang.window_s:.1f}s")


async def test_slowed_rank_is_reported_within_ten_steps_and_left_alone(lab: LabHandle) -> None:
    async with monitored_demo(lab, "slow", checkpoint=False) as (job, rec):
        base = await baseline(lab, job)
        # A healthy stretch first: every rank's timing is learned, and nothing is flagged in it.
        lab.wait_for(lambda: sum(1 for line in job.rank_lines(2) if STEP.match(line)) >= 40, 60)
        healthy = await rec.query()
        assert healthy is not None and not healthy.incidents, rec.describe()
        record = inject(lab.layout, "slow", run=job.run, rank=2, delay_s=0.4)
        assert record.node is not None
        st = await rec.wait(
            lambda s: any(i.anomaly.kind is AnomalyKind.STRAGGLER for i in s.incidents), 60, "a straggler incident"
        )
        inc = next(i for i in st.incidents if i.anomaly.kind is AnomalyKind.STRAGGLER)
        assert inc.attribution is not None and record.node in inc.attribution.implicated_nodes, inc.attribution
        assert 2 in inc.attribution.implicated_ranks, inc.attribution
        # Within 10 steps of the slowdown: count rank 2's steps logged between t0 and the detection.
        steps_after = [
            line for line in job.rank_lines(2) if STEP.match(line) and _epoch(line) > record.t0_epoch
            and _epoch(line) <= inc.detected_at.timestamp()
        ]  # fmt: skip
        assert len(steps_after) <= 10, (len(steps_after), inc.detected_at)
        # Report only: the job is untouched.
        assert not inc.actions, inc.actions
        now = await slurm_job(lab, job.job_id)
        assert now.restart_count == base.restart_count and now.nodes == base.nodes
        assert not sinfo_drains(lab)
        print(
            f"straggler: detected {inc.detected_at.timestamp() - record.t0_epoch:.1f}s after t0, "
            f"{len(steps_after)} steps; {inc.anomaly.summary}"
        )


async def test_silent_xid_is_detected_from_the_gpu_alone(lab: LabHandle) -> None:
    async with monitored_demo(lab, "silentxid") as (job, rec):
        base = await baseline(lab, job)
        try:
            record = inject(lab.layout, "xid", run=job.run, rank=1, xid=48)
            assert record.node is not None
            st = await rec.wait_resumed(timeout_s=60)
            inc = await assert_recovered_once(lab, rec, base, bad_node=record.node)
            assert inc.anomaly.kind is AnomalyKind.GPU_FAULT, inc.anomaly
            att = inc.attribution
            assert att is not None and att.failure_class is FailureClass.HARDWARE and "48" in att.cause, att
            # No rank printed an error before the recovery: the GPU signal was the only evidence (the old attempt's
            # ranks do print errors once the requeue stops them, after the decision).
            assert inc.anomaly.evidence == () or all(e.source is EvidenceSource.GPU for e in inc.anomaly.evidence)
            assert all(e.source is EvidenceSource.GPU for e in att.evidence), att.evidence
            print(latency_report("silent XID 48", st, inc, record.t0_epoch))
        finally:
            for n in base.nodes:
                lab.lab.rebound.reset_gpus(n)


def _epoch(line: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
