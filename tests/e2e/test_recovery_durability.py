"""End to end on the test lab: a recovery survives its worker being SIGKILLed, or Temporal restarting, mid-way.

Each test breaks a monitored demo job (rank 3 crashes; where the kill must land inside a drain, rank 3's GPU
reports XID 79 instead: a crash alone only excludes its node), stops the lab's Rebound worker with SIGKILL at one
stage of the recovery, starts a new worker, and checks that the recovery completes exactly once: slurmctld's
own log shows one drain (with this incident's reason, for the XID) and one requeue, the job's restart count went
up by one, and the workflow's incident holds one verified action of each kind. The last test restarts the
Temporal server (its SQLite file kept) instead.

To stop the worker *inside* the drain or the requeue, those tests run a worker whose ``scontrol`` sleeps 3 s
before acting (``REBOUND_SLURM__BIN_DIR``: a wrapper, no production change), and kill it once the timeline shows
the action decided *and* the worker's ``scontrol`` for it is running. The killed worker's ``scontrol``
keeps running and acts after the worker is gone, as a command already sent to a real scheduler would: the new
worker's retry must notice, not act twice.

Costs measured on 2 cores (facts/temporal.md §0): a SIGKILLed worker's workflows wait ~10 s for the sticky
queue; an activity it was running is retried only after its heartbeat timeout (drain/requeue 10 s, resume-wait
30 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.demo.inject import inject
from tests.e2e.recovery_support import (
    Recovery,
    assert_recovered_once,
    baseline,
    incident_of,
    monitored_demo,
    sigkill_worker,
    slow_scontrol_worker,
    stop_worker,
    wait_for_worker_command,
    worker_is_normal,
    worker_log_mark,
    worker_log_since,
    worker_pid,
)
from tests.lab_support import LabHandle
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

pytestmark = pytest.mark.slow

CRASH_RANK = 3
#: Kill -> new worker -> sticky-queue wait (10 s) -> activity retry after its heartbeat timeout (10-30 s) -> resume
#: (~15 s), with a loaded machine's margin.
AFTER_KILL_S = 90


@pytest.fixture(autouse=True)
def _normal_lab_after(lab: LabHandle) -> Iterator[None]:
    """Whatever happens, the next test gets the lab's Temporal server and its normal worker, running."""
    yield
    lab.lab.temporal.start()
    if not worker_is_normal(lab):
        stop_worker(lab)
    lab.lab.rebound.start()


def _drain_attempts(lab: LabHandle, mark: int, node: str) -> int:
    return sum(1 for line in worker_log_since(lab, mark) if f"drain {node} (rebound: " in line)


def _requeue_attempts(lab: LabHandle, mark: int, job_id: int) -> int:
    return sum(1 for line in worker_log_since(lab, mark) if f"requeue job {job_id} excluding" in line)


def _report(name: str, rec: Recovery, killed_at: float, t0: float, lab: LabHandle, mark: int, node: str) -> None:
    st = rec.last
    assert st is not None
    inc = incident_of(st)
    assert inc is not None and inc.resumed_at is not None
    print(
        f"\n[{name}] at {killed_at - t0:.1f} s after t0; the job trained again at "
        f"{inc.resumed_at.timestamp() - t0:.1f} s, the workflow knew at {time.time() - t0:.1f} s"
        f"; worker attempts: drain x{_drain_attempts(lab, mark, node)}, "
        f"requeue x{_requeue_attempts(lab, mark, rec.job.job_id)}; states seen "
        + ",".join(s.value for s in rec.seen_states)
    )


def _actions(st: JobRecoveryStatus) -> int:
    inc = incident_of(st)
    return len(inc.actions) if inc else 0


async def test_worker_killed_right_after_detection(lab: LabHandle) -> None:
    async with monitored_demo(lab, "kill-detect") as (job, rec):
        base = await baseline(lab, job)
        mark = worker_log_mark(lab)
        record = inject(lab.layout, "crash", run=job.run, rank=CRASH_RANK)
        assert record.node is not None
        st = await rec.wait(
            lambda s: s.state in (RecoveryState.DETECTED, RecoveryState.ATTRIBUTED) and _actions(s) == 0,
            20,
            "the incident detected, nothing done yet",
            interval_s=0.05,
        )
        killed_at = time.time()
        sigkill_worker(lab)
        assert base.ctld.drains() == [] and base.ctld.requeues(job.job_id) == 0, "killed too late"
        lab.lab.rebound.start()

        await rec.wait_resumed(timeout_s=AFTER_KILL_S)
        await assert_recovered_once(lab, rec, base, bad_node=record.node, drained=False)
        _report(f"kill at {st.state.value}", rec, killed_at, record.t0_epoch, lab, mark, record.node)


async def test_worker_killed_during_the_drain(lab: LabHandle, tmp_path: Path) -> None:
    with slow_scontrol_worker(lab, tmp_path):
        async with monitored_demo(lab, "kill-drain") as (job, rec):
            base = await baseline(lab, job)
            mark = worker_log_mark(lab)
            # A drain needs node-level evidence (a rank's crash only excludes its node): an XID the node agent reads.
            record = inject(lab.layout, "gpu-fault", run=job.run, rank=CRASH_RANK, xid=79)
            assert record.node is not None
            try:
                await rec.wait_timeline("FLEET", "asked", timeout_s=20)  # the Fleet drains: wait for its scontrol
                wait_for_worker_command(lab, "scontrol", "update", f"nodename={record.node}", "state=drain")
                killed_at = time.time()
                sigkill_worker(lab)
                assert base.ctld.drains() == [], "the drain was done before the kill: not a kill during the drain"
                # The dead worker's scontrol still drains the node: done, but never reported to Temporal.
                lab.wait_for(base.ctld.drains, 10)
                lab.lab.rebound.start()  # the lab's normal worker takes over

                await rec.wait_resumed(timeout_s=AFTER_KILL_S)
                await assert_recovered_once(lab, rec, base, bad_node=record.node)
                # Two drain attempts (the killed one, then the retry), one drain in Slurm: the retry noticed.
                assert _drain_attempts(lab, mark, record.node) >= 2
                _report("kill during drain", rec, killed_at, record.t0_epoch, lab, mark, record.node)
            finally:
                for n in base.nodes:  # the XID was appended to the node's fake NVML state: repair the "hardware"
                    lab.lab.rebound.reset_gpus(n)


async def test_worker_killed_during_the_requeue(lab: LabHandle, tmp_path: Path) -> None:
    with slow_scontrol_worker(lab, tmp_path):
        async with monitored_demo(lab, "kill-requeue") as (job, rec):
            base = await baseline(lab, job)
            mark = worker_log_mark(lab)
            record = inject(lab.layout, "crash", run=job.run, rank=CRASH_RANK)
            assert record.node is not None
            await rec.wait_timeline("REQUEUE", "decided", timeout_s=30)
            wait_for_worker_command(lab, "scontrol", "requeuehold", str(job.job_id))
            killed_at = time.time()
            sigkill_worker(lab)
            assert base.ctld.requeues(job.job_id) == 0, "the requeue was done before the kill"
            # The dead worker's `scontrol requeuehold` still requeues the job (held): done, never reported.
            lab.wait_for(lambda: base.ctld.requeues(job.job_id), 10)
            lab.lab.rebound.start()

            await rec.wait_resumed(timeout_s=AFTER_KILL_S)
            await assert_recovered_once(lab, rec, base, bad_node=record.node, drained=False)
            assert _requeue_attempts(lab, mark, job.job_id) >= 2
            _report("kill during requeue", rec, killed_at, record.t0_epoch, lab, mark, record.node)


async def test_worker_killed_while_waiting_for_the_resume(lab: LabHandle) -> None:
    async with monitored_demo(lab, "kill-verify") as (job, rec):
        base = await baseline(lab, job)
        mark = worker_log_mark(lab)
        record = inject(lab.layout, "crash", run=job.run, rank=CRASH_RANK)
        assert record.node is not None
        await rec.wait(lambda s: s.state is RecoveryState.VERIFYING, 30, "VERIFYING", interval_s=0.05)
        killed_at = time.time()
        sigkill_worker(lab)
        assert base.ctld.requeues(job.job_id) == 1
        lab.lab.rebound.start()

        await rec.wait_resumed(timeout_s=AFTER_KILL_S)
        await assert_recovered_once(lab, rec, base, bad_node=record.node, drained=False)
        _report("kill while verifying", rec, killed_at, record.t0_epoch, lab, mark, record.node)


async def test_temporal_restart_during_the_drain(lab: LabHandle, tmp_path: Path) -> None:
    with slow_scontrol_worker(lab, tmp_path):
        async with monitored_demo(lab, "temporal-restart") as (job, rec):
            base = await baseline(lab, job)
            mark = worker_log_mark(lab)
            pid = worker_pid(lab)
            # A drain needs node-level evidence (a rank's crash only excludes its node): an XID the node agent reads.
            record = inject(lab.layout, "gpu-fault", run=job.run, rank=CRASH_RANK, xid=79)
            assert record.node is not None
            await rec.wait_timeline("FLEET", "asked", timeout_s=20)  # the Fleet drains: wait for its scontrol
            wait_for_worker_command(lab, "scontrol", "update", f"nodename={record.node}", "state=drain")
            stopped_at = time.time()
            try:
                lab.lab.temporal.stop()
                assert lab.lab.temporal.pid() is None
                assert base.ctld.drains() == [], "the drain was done before Temporal stopped"
                # The worker's drain finishes while Temporal is down: its result cannot be reported for a while.
                lab.wait_for(base.ctld.drains, 10)
                await asyncio.sleep(2)
            finally:
                down_s = time.time() - stopped_at
                lab.lab.temporal.start()  # same SQLite file: every workflow and its history are kept
                for n in base.nodes:  # the XID was appended to the node's fake NVML state: repair the "hardware"
                    lab.lab.rebound.reset_gpus(n)
            up_s = time.time() - stopped_at

            await rec.wait_resumed(timeout_s=AFTER_KILL_S)
            # The worker rode out the outage by itself: same process, and it did the rest of the recovery.
            assert worker_pid(lab) == pid, "the worker did not survive the Temporal restart"
            await assert_recovered_once(lab, rec, base, bad_node=record.node)
            _report("Temporal restart", rec, stopped_at, record.t0_epoch, lab, mark, record.node)
            print(
                f"  Temporal down for {down_s:.1f} s (drain done meanwhile), serving again {up_s:.1f} s after the stop"
            )
