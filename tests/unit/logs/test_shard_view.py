"""A watch shard's view built from the shared feed's updates: digests, in-order deltas, duplicates, gaps."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.logs.shard_view import ShardView, view_says_changed
from workflows.domain.loop import JobWatchInput
from workflows.domain.scheduler_feed import FeedUpdate
from workflows.domain.slurm import JobState, NodeBaseState, SlurmJob, SlurmNode

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def _u(seq: int, *, epoch: str = "a", digest: bool = False, part: int = 0, parts: int = 1, **kw: object) -> FeedUpdate:
    return FeedUpdate(shard=0, epoch=epoch, seq=seq, observed_at=T0, digest=digest, part=part, parts=parts, **kw)


J1 = SlurmJob(job_id=1, state=JobState.RUNNING, nodes=("n1",))
J2 = SlurmJob(job_id=2, state=JobState.RUNNING, nodes=("n2",))
N1 = SlurmNode(name="n1", state=NodeBaseState.ALLOCATED)


def test_not_ready_until_a_digest_then_deltas_apply_in_order() -> None:
    view = ShardView(0)
    view.apply([_u(1, jobs=(J1,))])  # a delta before any digest: nothing to apply it to
    assert not view.ready and view.snapshot_of(1, ()) is None
    view.apply([_u(2, digest=True, jobs=(J1, J2), nodes=(N1,))])
    assert view.ready
    view.apply([_u(3, jobs=(J1.model_copy(update={"state": JobState.FAILED}),), removed=(2,))])
    snap = view.snapshot_of(1, ())
    assert snap is not None and snap.jobs[0].state is JobState.FAILED and snap.nodes == (N1,)
    gone = view.snapshot_of(2, ("n2",))
    assert gone is not None and gone.jobs == ()


def test_a_duplicate_is_ignored_and_a_gap_makes_the_view_not_ready_until_the_next_digest() -> None:
    view = ShardView(0)
    view.apply([_u(1, digest=True, jobs=(J1,)), _u(2, jobs=(J2,))])
    view.apply([_u(2, jobs=(J2.model_copy(update={"state": JobState.FAILED}),))])  # the same seq again: ignored
    assert view.jobs[2].state is JobState.RUNNING
    view.apply([_u(4, removed=(1,))])  # seq 3 lost
    assert not view.ready
    view.apply([_u(5, jobs=(J1,))])  # later deltas do not make it ready
    assert not view.ready
    view.apply([_u(6, digest=True, jobs=(J2,))])
    assert view.ready and set(view.jobs) == {2}


def test_a_new_feed_epoch_starts_with_its_digest_and_a_digest_in_parts_applies_whole() -> None:
    view = ShardView(0)
    view.apply([_u(1, digest=True, jobs=(J1,))])
    view.apply([_u(1, epoch="b", digest=True, parts=2, jobs=(J2,))])
    assert view.ready and set(view.jobs) == {1}  # the old view serves until the new digest is whole
    view.apply([_u(2, epoch="b", digest=True, part=1, parts=2, nodes=(N1,))])
    assert set(view.jobs) == {2} and set(view.nodes) == {"n1"}
    view.apply([_u(3, epoch="b", jobs=(J1,))])
    assert set(view.jobs) == {1, 2}


def test_a_change_the_view_shows_is_confirmed_with_the_scheduler_before_it_is_believed() -> None:
    view = ShardView(0)
    view.apply([_u(1, digest=True, jobs=(J1,))])
    watch = JobWatchInput(job_id=1, poll_interval_s=1, last_state=JobState.RUNNING)
    snap = view.snapshot_of(1, ())
    assert snap is not None and not view_says_changed(snap, watch)
    assert view_says_changed(snap, watch.model_copy(update={"last_restart_count": 1}))  # a requeue it lags
    absent = view.snapshot_of(9, ())
    assert absent is not None and view_says_changed(absent, watch.model_copy(update={"job_id": 9}))


def test_a_digest_sent_again_applies_to_a_view_that_is_not_ready_and_is_ignored_by_a_ready_one() -> None:
    view = ShardView(0)
    view.apply([_u(1, digest=True, jobs=(J1,)), _u(3, jobs=(J2,))])  # seq 2 lost: not ready
    assert not view.ready
    view.apply([_u(1, digest=True, jobs=(J1,)), _u(2, removed=(1,)), _u(3, jobs=(J2,))])  # the mailbox's replay
    assert view.ready and set(view.jobs) == {2}
    view.apply([_u(1, digest=True, jobs=(J1,))])  # a replay to a ready view changes nothing
    assert set(view.jobs) == {2}
