"""The feed's per-attempt state: a digest to every shard first and every digest interval, deltas between, a
digest for a shard whose publish failed, and seq numbers that never repeat within an attempt."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.slurm.scheduler_feed import FeedState
from workflows.domain.scheduler_feed import SchedulerFeedInput
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
INP = SchedulerFeedInput(
    cluster="c", shards=4, watch_task_queue="w", shard_queue_prefix="s-", poll_interval_s=1, digest_interval_s=60
)


def _snap(*states: JobState) -> ClusterSnapshot:
    return ClusterSnapshot(
        observed_at=T0, jobs=tuple(SlurmJob(job_id=i, state=s, nodes=("n1",)) for i, s in enumerate(states))
    )


def test_digests_first_then_only_changes_then_digests_again_on_the_interval() -> None:
    feed = FeedState(INP, epoch="e")
    first = feed.next(_snap(JobState.RUNNING, JobState.RUNNING), now=0)
    assert sorted(first) == [0, 1, 2, 3] and all(u.digest for b in first.values() for u in b)
    assert feed.next(_snap(JobState.RUNNING, JobState.RUNNING), now=1) == {}  # nothing changed: nothing sent
    delta = feed.next(_snap(JobState.RUNNING, JobState.FAILED), now=2)
    assert list(delta) == [1] and not delta[1][0].digest and delta[1][0].seq == 2
    again = feed.next(_snap(JobState.RUNNING, JobState.FAILED), now=61)
    assert sorted(again) == [0, 1, 2, 3] and again[1][0].seq == 3 and again[0][0].seq == 2


def test_a_shard_whose_publish_failed_gets_a_digest_next_poll() -> None:
    feed = FeedState(INP, epoch="e")
    feed.next(_snap(JobState.RUNNING, JobState.RUNNING), now=0)
    feed.failed = {2}
    out = feed.next(_snap(JobState.RUNNING, JobState.RUNNING), now=1)
    assert list(out) == [2] and out[2][0].digest and out[2][0].seq == 2
    assert feed.next(_snap(JobState.RUNNING, JobState.RUNNING), now=2) == {}
