"""What the shared scheduler feed publishes (ADR 015, "One scheduler poll per cluster"). Pure: the feed activity
polls, calls these, and signals the answer.

- ``diff``: the jobs that are new or changed, the jobs gone, the nodes changed, between two snapshots (by id, O(n)).
  A pending job's ``start_time``/``end_time`` are the scheduler's estimates, re-estimated every backfill cycle:
  they are not a change (else every pending job would be a delta every few seconds).
- ``route``: each shard's part of a diff: its jobs (``shard_of``), and a changed node to the shards whose jobs run
  on it (now or in the previous snapshot: a job that just left a node still hears that node's change).
- ``digest``: each shard's jobs and the nodes they run on.
- ``updates``: a shard's part as numbered ``FeedUpdate`` payloads, a large digest cut into parts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from workflows.domain.scheduler_feed import MAX_UPDATE_ITEMS, FeedUpdate
from workflows.domain.slurm import ClusterSnapshot, JobState, SlurmJob, SlurmNode
from workflows.domain.watch_routing import shard_of

__all__ = ["ShardPart", "SnapshotDiff", "diff", "digest", "route", "updates"]


@dataclass(frozen=True)
class SnapshotDiff:
    """What changed between two snapshots."""

    jobs: tuple[SlurmJob, ...] = ()
    removed: tuple[int, ...] = ()
    nodes: tuple[SlurmNode, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.jobs or self.removed or self.nodes)


@dataclass
class ShardPart:
    """One shard's part of a diff or a digest."""

    jobs: list[SlurmJob] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    nodes: list[SlurmNode] = field(default_factory=list)


_ESTIMATES = {"start_time", "end_time"}


def _same_job(a: SlurmJob, b: SlurmJob) -> bool:
    if a == b:
        return True
    if a.state is JobState.PENDING and b.state is JobState.PENDING:
        return a.model_dump(exclude=_ESTIMATES) == b.model_dump(exclude=_ESTIMATES)
    return False


def diff(prev: ClusterSnapshot | None, cur: ClusterSnapshot) -> SnapshotDiff:
    """The jobs new or changed, the job ids gone, and the nodes new or changed from ``prev`` to ``cur`` (all of
    ``cur`` when there is no ``prev``). A node the scheduler stopped listing is not reported: jobs running on it
    are reported by their own state."""
    before_jobs = {j.job_id: j for j in prev.jobs} if prev is not None else {}
    before_nodes = {n.name: n for n in prev.nodes} if prev is not None else {}
    jobs = tuple(j for j in cur.jobs if (b := before_jobs.get(j.job_id)) is None or not _same_job(b, j))
    listed = {j.job_id for j in cur.jobs}
    removed = tuple(sorted(i for i in before_jobs if i not in listed))
    nodes = tuple(n for n in cur.nodes if before_nodes.get(n.name) != n)
    return SnapshotDiff(jobs=jobs, removed=removed, nodes=nodes)


def _node_shards(snaps: Iterable[ClusterSnapshot | None], shards: int) -> Mapping[str, set[int]]:
    index: defaultdict[str, set[int]] = defaultdict(set)
    for snap in snaps:
        for job in snap.jobs if snap is not None else ():
            for node in job.nodes:
                index[node].add(shard_of(job.job_id, shards))
    return index


def route(
    change: SnapshotDiff, prev: ClusterSnapshot | None, cur: ClusterSnapshot, shards: int
) -> dict[int, ShardPart]:
    """Each shard's part of ``change`` (only shards with something in it)."""
    parts: defaultdict[int, ShardPart] = defaultdict(ShardPart)
    for job in change.jobs:
        parts[shard_of(job.job_id, shards)].jobs.append(job)
    for job_id in change.removed:
        parts[shard_of(job_id, shards)].removed.append(job_id)
    if change.nodes:
        index = _node_shards((prev, cur), shards)
        for node in change.nodes:
            for k in sorted(index.get(node.name, ())):
                parts[k].nodes.append(node)
    return dict(parts)


def digest(cur: ClusterSnapshot, shards: int) -> dict[int, ShardPart]:
    """Every shard's jobs and the nodes they run on (every shard, an empty one included: it empties the view)."""
    parts = {k: ShardPart() for k in range(shards)}
    names: dict[int, set[str]] = {k: set() for k in range(shards)}
    for job in cur.jobs:
        k = shard_of(job.job_id, shards)
        parts[k].jobs.append(job)
        names[k].update(job.nodes)
    for node in cur.nodes:
        for k in range(shards):
            if node.name in names[k]:
                parts[k].nodes.append(node)
    return parts


def updates(
    shard: int, part: ShardPart, *, epoch: str, first_seq: int, observed_at: datetime, is_digest: bool
) -> list[FeedUpdate]:
    """``part`` as updates numbered from ``first_seq``; a digest over ``MAX_UPDATE_ITEMS`` in several parts (each
    at most that many items), a delta likewise (its parts are ordinary consecutive deltas)."""
    chunks = [ShardPart()]

    def room() -> ShardPart:
        last = chunks[-1]
        if len(last.jobs) + len(last.nodes) + len(last.removed) >= MAX_UPDATE_ITEMS:
            chunks.append(ShardPart())
        return chunks[-1]

    for job in part.jobs:
        room().jobs.append(job)
    for node in part.nodes:
        room().nodes.append(node)
    for job_id in part.removed:
        room().removed.append(job_id)
    return [
        FeedUpdate(
            shard=shard,
            epoch=epoch,
            seq=first_seq + i,
            observed_at=observed_at,
            digest=is_digest,
            part=i if is_digest else 0,
            parts=len(chunks) if is_digest else 1,
            jobs=tuple(c.jobs),
            nodes=tuple(c.nodes),
            removed=tuple(c.removed),
        )
        for i, c in enumerate(chunks)
    ]
