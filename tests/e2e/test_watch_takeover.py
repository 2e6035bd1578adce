"""End to end on the test lab: two worker processes, the one running a job's watch shard is SIGKILLed, the other
takes the shard over (Temporal retries its heartbeat-timed-out activity there) and the job's crash, injected right
after the kill, is detected once and recovered once (ADR 015). Prints the measured takeover time."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Iterator

import pytest

from deploy.demo.inject import inject
from deploy.local.processes import kill_and_wait, spawn
from tests.e2e.recovery_support import (
    assert_recovered_once,
    baseline,
    incident_of,
    monitored_demo,
    sigkill_worker,
    stop_worker,
)
from tests.lab_support import LabHandle, lab_rebound_settings
from workflows.domain.watch_routing import shard_of

pytestmark = pytest.mark.slow

#: The shard activity's heartbeat timeout (30 s) + retry backoff + the second worker's poll: well inside this.
TAKEOVER_LIMIT_S = 60
SECOND = "worker-b"


def _log_since(lab: LabHandle, name: str, offset: int) -> str:
    path = lab.layout.log_file(name)
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


@pytest.fixture
def second_worker(lab: LabHandle) -> Iterator[int]:
    """A second worker process against the same lab (same settings), stopped after the test; the lab's own
    worker is running again after it."""
    pid = spawn(
        [sys.executable, "-m", "workers.cli", "worker"],
        log_file=lab.layout.log_file(SECOND),
        pid_file=lab.layout.pid_file(SECOND),
        env=lab.lab.rebound.common_env(),
    )
    lab.wait_for(lambda: "watch shards running" in _log_since(lab, SECOND, 0), 60)
    try:
        yield pid
    finally:
        kill_and_wait([pid], term_timeout_s=15)
        lab.layout.pid_file(SECOND).unlink(missing_ok=True)
        if lab.lab.rebound.pid("worker") is None:
            stop_worker(lab)
        lab.lab.rebound.start()


async def test_a_killed_workers_shard_is_taken_over_and_its_jobs_crash_recovered_once(
    lab: LabHandle, second_worker: int
) -> None:
    shards = lab_rebound_settings(lab).watch.shards
    async with monitored_demo(lab, "takeover") as (job, rec):
        shard = shard_of(job.job_id, shards)
        running = re.compile(rf"shard {shard}: running \(attempt (\d+)")
        # The lab's worker started the shards before the second worker existed: it runs this one.
        assert not running.search(_log_since(lab, SECOND, 0)), "the second worker already runs the job's shard"
        # A new member is durable once the shard's heartbeat carrying it was sent: details are rebuilt within 5 s of
        # a change, the SDK sends a heartbeat every 24 s (0.8 x 30 s). Before that a takeover loses it until the
        # job's first renewal (60 s): not what this test measures.
        st0 = await rec.wait_timeline("WATCHED", timeout_s=30)
        watched_at = next(e.at for e in st0.timeline if e.event == "WATCHED")
        await asyncio.sleep(max(0.0, 35 - (time.time() - watched_at.timestamp())))
        base = await baseline(lab, job)
        mark_b = lab.layout.log_file(SECOND).stat().st_size
        killed_at = time.time()
        sigkill_worker(lab)
        record = inject(lab.layout, "crash", run=job.run, rank=3)  # while nobody watches the shard
        took = lab.wait_for(
            lambda: running.search(_log_since(lab, SECOND, mark_b)) and time.time() - killed_at, TAKEOVER_LIMIT_S + 10
        )
        assert isinstance(took, float)
        restored = re.findall(
            rf"shard {shard}: running \(attempt \d+, (\d+) members restored", _log_since(lab, SECOND, mark_b)
        )
        print(f"\n[takeover] shard {shard} of {shards} taken over {took:.1f} s after the SIGKILL, members {restored}")
        assert restored and int(restored[-1]) >= 1, "the job's subscription was not restored from the heartbeat"
        st = await rec.wait_resumed(timeout_s=TAKEOVER_LIMIT_S + 90)
        await assert_recovered_once(lab, rec, base, bad_node=record.node or "", drained=False)
        inc = incident_of(st)
        assert inc is not None and inc.detected_at is not None
        assert len(st.incidents) == 1
        print(
            f"\n[takeover] the crash (injected at the kill) detected "
            f"{inc.detected_at.timestamp() - record.t0_epoch:.1f} s after it"
        )
        assert took <= TAKEOVER_LIMIT_S
