"""The shared scheduler feed's pure part: diff, per-shard routing, digests, and payload sizes at 10,000 jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.contrib.pydantic import pydantic_data_converter

from workflows.domain.scheduler_feed import MAX_UPDATE_ITEMS, FeedUpdate
from workflows.domain.slurm import ClusterSnapshot, JobState, NodeBaseState, SlurmJob, SlurmNode
from workflows.policy.scheduler_feed import ShardPart, diff, digest, route, updates

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
LIMIT = 2 * 1024 * 1024  # Temporal's payload limit


def _job(job_id: int, state: JobState = JobState.RUNNING, nodes: tuple[str, ...] = ("n1",), **kw: object) -> SlurmJob:
    return SlurmJob(job_id=job_id, state=state, nodes=nodes, **kw)


def _node(name: str, state: NodeBaseState = NodeBaseState.ALLOCATED) -> SlurmNode:
    return SlurmNode(name=name, state=state)


def _snap(jobs: list[SlurmJob], nodes: list[SlurmNode], at: datetime = T0) -> ClusterSnapshot:
    return ClusterSnapshot(observed_at=at, jobs=tuple(jobs), nodes=tuple(nodes))


def test_diff_reports_new_changed_gone_jobs_and_changed_nodes_only() -> None:
    prev = _snap([_job(1), _job(2), _job(3)], [_node("n1"), _node("n2")])
    cur = _snap(
        [_job(1), _job(2, JobState.FAILED), _job(4)],
        [_node("n1"), _node("n2", NodeBaseState.DOWN)],
        T0 + timedelta(seconds=1),
    )
    change = diff(prev, cur)
    assert [j.job_id for j in change.jobs] == [2, 4]
    assert change.removed == (3,)
    assert [n.name for n in change.nodes] == ["n2"]
    assert not diff(cur, cur)  # nothing changed: nothing to publish (the steady state costs no action)
    assert len(diff(None, cur).jobs) == 3  # no previous snapshot: everything is new


def test_a_pending_jobs_re_estimated_start_is_not_a_change_but_a_running_jobs_restart_is() -> None:
    prev = _snap([_job(1, JobState.PENDING, start_time=T0), _job(2, start_time=T0)], [])
    cur = _snap(
        [_job(1, JobState.PENDING, start_time=T0 + timedelta(minutes=5)), _job(2, start_time=T0, restart_count=1)], []
    )
    assert [j.job_id for j in diff(prev, cur).jobs] == [2]


def test_route_sends_each_job_to_its_shard_and_a_node_to_the_shards_running_on_it_now_or_before() -> None:
    prev = _snap(
        [_job(1, nodes=("n1",)), _job(2, nodes=("n2",)), _job(5, nodes=("n1", "n2"))], [_node("n1"), _node("n2")]
    )
    # job 5 (shard 1 of 4) left n1; n1 goes down: shards 1 (job 1, job 5 before) and ... job 1 is shard 1 too.
    cur = _snap(
        [_job(1, nodes=("n1",)), _job(2, JobState.FAILED, nodes=("n2",)), _job(5, nodes=("n2",))],
        [_node("n1", NodeBaseState.DOWN), _node("n2")],
    )
    parts = route(diff(prev, cur), prev, cur, shards=4)
    assert set(parts) == {1, 2}
    assert [j.job_id for j in parts[2].jobs] == [2] and parts[2].nodes == []
    assert [j.job_id for j in parts[1].jobs] == [5]
    assert [n.name for n in parts[1].nodes] == ["n1"]  # job 1 runs on it; job 5 ran on it a poll ago


def test_digest_gives_every_shard_its_jobs_and_their_nodes_only() -> None:
    cur = _snap(
        [_job(1, nodes=("n1",)), _job(2, nodes=("n2", "n3"))], [_node("n1"), _node("n2"), _node("n3"), _node("n4")]
    )
    parts = digest(cur, shards=3)
    assert set(parts) == {0, 1, 2}
    assert parts[0] == ShardPart()  # an empty shard still gets its (empty) digest: it empties the view
    assert [n.name for n in parts[2].nodes] == ["n2", "n3"]


def test_updates_number_consecutively_and_split_a_large_digest_into_parts() -> None:
    part = ShardPart(jobs=[_job(i) for i in range(MAX_UPDATE_ITEMS + 10)], nodes=[_node("n1")])
    out = updates(3, part, epoch="e", first_seq=7, observed_at=T0, is_digest=True)
    assert [(u.seq, u.part, u.parts) for u in out] == [(7, 0, 2), (8, 1, 2)]
    assert sum(len(u.jobs) for u in out) == MAX_UPDATE_ITEMS + 10 and out[1].nodes == (_node("n1"),)
    assert all(u.items <= MAX_UPDATE_ITEMS for u in out)


def _realistic(n_jobs: int, ranks_nodes: int = 8) -> ClusterSnapshot:
    """Jobs with the fields squeue really fills (long paths, comments, eight nodes each)."""
    jobs = [
        SlurmJob(
            job_id=100_000 + i,
            name=f"llama-70b-pretrain-run-{i:05d}",
            user=f"user{i % 300:03d}",
            user_id=10_000 + i % 300,
            partition="gpu-h100",
            state=JobState.RUNNING,
            state_reason="None",
            nodes=tuple(f"gpu-{(i * ranks_nodes + r) % 2000:04d}" for r in range(ranks_nodes)),
            batch_host=f"gpu-{(i * ranks_nodes) % 2000:04d}",
            requeue_allowed=True,
            node_count=ranks_nodes,
            task_count=ranks_nodes * 8,
            comment=f"rebound: budget=3 ckpt=/lustre/project/team{i % 40}/checkpoints/run-{i:05d}",
            standard_output=f"/lustre/project/team{i % 40}/logs/run-{i:05d}/slurm-%j.out",
            standard_error=f"/lustre/project/team{i % 40}/logs/run-{i:05d}/slurm-%j.err",
            working_directory=f"/lustre/project/team{i % 40}/src/megatron",
            submit_time=T0,
            eligible_time=T0,
            start_time=T0,
            end_time=T0 + timedelta(days=2),
            tres_per_node="gres/gpu:8",
            gpus_per_node=8,
            cpus_per_node=96,
        )
        for i in range(n_jobs)
    ]
    nodes = [
        SlurmNode(
            name=f"gpu-{k:04d}", state=NodeBaseState.ALLOCATED, partitions=("gpu-h100",), gres="gpu:h100:8", cpus=96
        )
        for k in range(2000)
    ]
    return _snap(jobs, nodes)


def _bytes(value: object) -> int:
    return pydantic_data_converter.payload_converter.to_payloads([value])[0].ByteSize()


def test_every_payload_stays_under_2_mb_at_10000_jobs_with_32_shards_and_with_one() -> None:
    cur = _realistic(10_000)
    largest = {}
    for shards in (32, 1):
        sizes = [
            _bytes(u)
            for k, part in digest(cur, shards).items()
            for u in updates(k, part, epoch="e", first_seq=1, observed_at=T0, is_digest=True)
        ]
        largest[shards] = max(sizes)
        assert largest[shards] < LIMIT
    # A batch the mailbox hands over (updates up to MAX_UPDATE_ITEMS items) is under the limit too.
    batch = updates(0, digest(cur, 1)[0], epoch="e", first_seq=1, observed_at=T0, is_digest=True)[:1]
    assert _bytes(batch) < LIMIT
    print(
        f"largest feed payload at 10,000 jobs: {largest[32] / 1e3:.0f} KB (32 shards), "
        f"{largest[1] / 1e3:.0f} KB (1 shard, in parts)"
    )


def test_a_few_changes_a_minute_cost_a_signal_each_and_nothing_else() -> None:
    prev = _realistic(10_000)
    jobs = list(prev.jobs)
    jobs[17] = jobs[17].model_copy(update={"state": JobState.FAILED})
    cur = _snap(jobs, list(prev.nodes), T0 + timedelta(seconds=1))
    parts = route(diff(prev, cur), prev, cur, shards=32)
    assert {k: len(p.jobs) for k, p in parts.items()} == {jobs[17].job_id % 32: 1}
    u = updates(0, next(iter(parts.values())), epoch="e", first_seq=1, observed_at=T0, is_digest=False)
    assert len(u) == 1 and _bytes(u[0]) < 4_000  # one job's change is a ~1 KB signal, not a listing
    assert isinstance(u[0], FeedUpdate)
