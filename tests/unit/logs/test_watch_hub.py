"""The watch hub's members (ADR 015): shard assignment, subscribe/renew/replace, events, heartbeat restore, the
details' size bound. Real log files in a temp directory, the real JobWatcher, a fake scheduler's snapshot."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.logs import watch_hub
from activities.logs.job_logs import LogPolicy
from activities.logs.watch_hub import DETAILS_RING, ShardHub, compact_progress
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import JobWatchInput, WatchOutcome
from workflows.domain.progress import ProgressSample, ProgressState, observe
from workflows.domain.slurm import ClusterSnapshot, JobState
from workflows.domain.watch_hub import WatchSubscription, WatchUnsubscribe
from workflows.domain.watch_routing import shard_of, shard_task_queue

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _sub(job_id: int, tmp: Path, seq: int = 1, run: str = "r1", **watch: object) -> WatchSubscription:
    inp = JobWatchInput.model_validate(
        {"job_id": job_id, "log_patterns": (str(tmp / "job-%j-*.log"),), "last_state": JobState.RUNNING, **watch}
    )
    return WatchSubscription(watch=inp, workflow_id=f"rebound/t/job/{job_id}", run_id=run, seq=seq)


def _step(tmp: Path, job_id: int, rank: int, step: int) -> None:
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    with (tmp / f"job-{job_id}-rank-{rank}.log").open("a") as f:
        f.write(f"{ts} [INFO] rank={rank}/2 node=n1 step={step} loss=0.5 step_time=0.1s\n")


async def _snap(sched: FakeScheduler) -> ClusterSnapshot:
    return await sched.snapshot()


def _poll(hub: ShardHub, snap: ClusterSnapshot) -> None:
    now = datetime.now(UTC)
    for key, step in hub.read_all(snap, now):
        hub.settle(key, step, None)


async def test_a_members_event_is_dated_after_its_line_was_read_not_at_the_polls_start(tmp_path: Path) -> None:
    """The shard stamps each member when its own lines have been read (``read_all`` without ``now``): the poll's
    start came before the scheduler snapshot's wait, and dated a crash seconds before its line (scale bench)."""
    sched = FakeScheduler()
    job = sched.submit(2)
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    _step(tmp_path, job.job_id, 0, 1)
    hub.subscribe(_sub(job.job_id, tmp_path, offsets={}))
    _poll(hub, await _snap(sched))
    poll_began = datetime.now(UTC)
    await asyncio.sleep(0.05)  # the snapshot wait; the line is written after the poll began
    written = datetime.now(UTC)
    with (tmp_path / f"job-{job.job_id}-rank-1.log").open("a") as f:
        f.write("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    sched.fail_job(job.job_id, exit_code=1)
    for key, step in hub.read_all(await _snap(sched)):
        hub.settle(key, step, None)
    [(_, member)] = hub.pending()
    assert member.pending is not None
    assert member.pending.result.observed_at >= written > poll_began


def test_jobs_split_by_id_modulo_shards() -> None:
    assert [shard_of(j, 4) for j in (8, 9, 10, 11, 12)] == [0, 1, 2, 3, 0]
    assert shard_task_queue("rebound-watch-shard-", 7) == "rebound-watch-shard-7"
    with pytest.raises(ValueError):
        shard_of(1, 0)


def test_same_seq_renews_and_keeps_the_hubs_offsets_higher_seq_replaces(tmp_path: Path) -> None:
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    sub = _sub(5, tmp_path)
    assert hub.subscribe(sub, T0) == "added"
    assert hub.changed  # the new member must reach the next heartbeat
    hub.details()
    assert not hub.changed
    hub.members[sub.workflow_id].watcher.state.offsets = {"/x": 100}
    assert hub.subscribe(sub, T0 + timedelta(hours=1)) == "renewed"
    assert not hub.changed
    assert hub.members[sub.workflow_id].watcher.state.offsets == {"/x": 100}
    assert hub.members[sub.workflow_id].renewed_at == T0 + timedelta(hours=1)
    assert hub.subscribe(_sub(5, tmp_path, seq=2), T0) == "replaced"
    assert hub.members[sub.workflow_id].watcher.state.offsets == {}
    assert hub.subscribe(_sub(5, tmp_path, seq=1), T0) == "stale"
    assert hub.members[sub.workflow_id].sub.seq == 2
    # A new run (continue-as-new) starts its counter again: its seq 1 replaces the old run's seq 2.
    assert hub.subscribe(_sub(5, tmp_path, seq=1, run="r2"), T0) == "replaced"


def test_unsubscribe_drops_only_its_own_subscription(tmp_path: Path) -> None:
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    hub.subscribe(_sub(5, tmp_path, seq=3), T0)
    assert not hub.unsubscribe(WatchUnsubscribe(workflow_id="rebound/t/job/5", run_id="r1", seq=2))
    assert not hub.unsubscribe(WatchUnsubscribe(workflow_id="rebound/t/job/5", run_id="r0", seq=3))
    assert hub.unsubscribe(WatchUnsubscribe(workflow_id="rebound/t/job/5", run_id="r1", seq=3))
    assert hub.members == {}


def test_members_not_renewed_for_two_leases_expire(tmp_path: Path) -> None:
    hub = ShardHub(0, LogPolicy(), lease_s=60)
    hub.subscribe(_sub(5, tmp_path), T0)
    assert hub.expire(T0 + timedelta(seconds=119)) == []
    assert hub.expire(T0 + timedelta(seconds=121)) == ["rebound/t/job/5"]


async def test_a_crash_line_becomes_one_pending_event_and_delivery_drops_the_member(tmp_path: Path) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    hub = ShardHub(3, LogPolicy(), lease_s=3600)
    _step(tmp_path, job.job_id, 0, 1)
    sub = _sub(job.job_id, tmp_path, offsets={})
    hub.subscribe(sub)
    _poll(hub, await _snap(sched))
    assert hub.pending() == []
    with (tmp_path / f"job-{job.job_id}-rank-1.log").open("a") as f:
        f.write("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    sched.fail_job(job.job_id, exit_code=1)
    _poll(hub, await _snap(sched))
    [(key, member)] = hub.pending()
    assert member.pending is not None
    assert (member.pending.seq, member.pending.shard, member.pending.run_id) == (1, 3, "r1")
    assert member.pending.result.outcome is WatchOutcome.ANOMALY
    # Not polled again while its event waits for delivery: one event per subscription.
    assert hub.read_all(await _snap(sched), datetime.now(UTC)) == []
    hub.delivered(key)
    assert hub.members == {}
    # A lease renewal that crossed the event in flight does not bring the member back.
    assert hub.subscribe(sub) == "stale"


async def test_a_restored_hub_goes_on_where_the_heartbeat_stopped_and_counts_no_line_twice(tmp_path: Path) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    hub.subscribe(_sub(job.job_id, tmp_path, offsets={}))
    snap = await _snap(sched)
    for step in range(1, 4):
        for rank in (0, 1):
            _step(tmp_path, job.job_id, rank, step)
        _poll(hub, snap)
    details = json.loads(json.dumps(hub.details()))  # what Temporal hands a retried attempt
    for step in range(4, 7):  # read by the worker that then dies: lost with it
        for rank in (0, 1):
            _step(tmp_path, job.job_id, rank, step)
        _poll(hub, snap)
    survivor = ShardHub.restore(details, 0, LogPolicy(), 3600, datetime.now(UTC))
    _poll(survivor, snap)  # re-reads steps 4-6: exactly what the heartbeat's progress had not folded
    [(key, old)] = hub.members.items()
    new = survivor.members[key]
    assert new.watcher.state.offsets == old.watcher.state.offsets
    before, after = old.watcher.state.progress, new.watcher.state.progress
    assert before is not None and after is not None
    for rank in (0, 1):
        r_old, r_new = before.rank(rank), after.rank(rank)
        assert r_old is not None and r_new is not None
        assert (r_new.last_step, r_new.progress_count, r_new.restarts) == (6, 6, 0)
        assert (r_old.last_step, r_old.progress_count) == (6, 6)


async def test_a_pending_event_survives_a_takeover(tmp_path: Path) -> None:
    sched = FakeScheduler()
    job = sched.submit(2)
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    hub.subscribe(_sub(job.job_id, tmp_path, offsets={}))
    sched.fail_job(job.job_id, exit_code=1)
    _poll(hub, await _snap(sched))
    assert len(hub.pending()) == 1
    survivor = ShardHub.restore(json.loads(json.dumps(hub.details())), 0, LogPolicy(), 3600, datetime.now(UTC))
    [(_, member)] = survivor.pending()
    assert member.pending is not None and member.pending.result.outcome is WatchOutcome.ANOMALY


def test_an_unreadable_heartbeat_restores_an_empty_hub() -> None:
    assert ShardHub.restore({"offsets": {}}, 0, LogPolicy(), 3600, T0).members == {}
    assert ShardHub.restore({"v": 1, "packed": "not base64 zlib"}, 0, LogPolicy(), 3600, T0).members == {}
    bad = {"x": {"sub": {"seq": 0}}}
    packed = base64.b64encode(zlib.compress(json.dumps(bad).encode())).decode()
    assert ShardHub.restore({"v": 1, "packed": packed}, 0, LogPolicy(), 3600, T0).members == {}


def _busy_progress(ranks: int, seed: int = 0) -> ProgressState:
    """Ranks with full timing rings and jittered (incompressible-ish) times, as a real job's are."""
    rnd = random.Random(seed)
    state = ProgressState()
    samples = [
        ProgressSample(
            rank=r,
            node=f"node{r:04d}",
            step=s,
            at=T0 + timedelta(seconds=s + rnd.random() / 3),
            step_time_s=0.1 + rnd.random() / 10,
        )
        for s in range(100)
        for r in range(ranks)
    ]
    return observe(state, samples, T0 + timedelta(seconds=200))


def _offsets(job_id: int, files: int) -> dict[str, int]:
    out: dict[str, int] = {"\0since": 1_764_590_400}
    for f in range(files):
        path = f"/scratch/users/someone/runs/llama-8b-pretrain/logs/job-{job_id}-rank-{f}.log"
        out[path] = 12_345_678
        out["\0crc:" + path] = 3_141_592_653
    return out


def test_details_of_10000_jobs_over_32_shards_stay_well_under_2_mb(tmp_path: Path) -> None:
    """~313 members per shard, 8 ranks and files each, full rings: the heartbeat's size (ADR 015's figure)."""
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    for i in range(10_000 // 32 + 1):
        job_id = 1_000_000 + 32 * i
        sub = _sub(job_id, tmp_path, offsets=_offsets(job_id, 8), progress=_busy_progress(8, seed=i))
        hub.subscribe(sub)
    began = time.perf_counter()
    details = hub.details()
    took = time.perf_counter() - began
    size = len(json.dumps(details, separators=(",", ":")))
    members = _unpack(details)
    raw = len(json.dumps(members, separators=(",", ":")))
    print(
        f"details at 10,000 jobs / 32 shards: {size} bytes ({raw} before compression) for {details['members']} "
        f"members, built in {took * 1000:.0f} ms"
    )
    assert size < 700_000
    assert all("progress" in m["sub"]["watch"] for m in members.values())  # nothing had to be cut
    ring = compact_progress(_busy_progress(8)).ranks[0]
    assert len(ring.step_times_s) == DETAILS_RING and len(ring.gaps_s) == DETAILS_RING


def test_details_past_the_bound_drop_progress_first_then_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = ShardHub(0, LogPolicy(), lease_s=3600)
    progress = _busy_progress(64)  # a big job: its progress is most of its entry
    for i in range(40):
        hub.subscribe(_sub(10 + i, tmp_path, offsets=_offsets(10 + i, 8), progress=progress))
    full = len(json.dumps(_unpack(hub.details()), separators=(",", ":")))
    monkeypatch.setattr(watch_hub, "MAX_DETAILS_BYTES", full // 2)
    members = _unpack(hub.details())
    assert len(json.dumps(members, separators=(",", ":"))) <= full // 2
    assert len(members) == 40  # every member kept; some without progress
    assert any("progress" not in m["sub"]["watch"] for m in members.values())
    monkeypatch.setattr(watch_hub, "MAX_DETAILS_BYTES", 40 * 600)  # not even the offsets fit: members cut
    assert 0 < len(_unpack(hub.details())) < 40
    monkeypatch.setattr(watch_hub, "MAX_DETAILS_BYTES", full)
    monkeypatch.setattr(watch_hub, "MAX_PACKED_BYTES", 2_000)  # the compressed bound cuts as well
    details = hub.details()
    assert len(details["packed"]) <= 2_000 and details["members"] < 40


def _unpack(details: dict[str, Any]) -> dict[str, Any]:
    members: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(details["packed"])))
    return members
