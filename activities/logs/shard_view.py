"""A watch shard's own view of the scheduler, built from the shared feed's updates (ADR 015, "One scheduler poll
per cluster"): the shard's jobs and the nodes they run on, nothing else.

A digest replaces the view (all its parts together); a delta applies only right after the update before it (same
``epoch``, ``seq`` + 1); a duplicate (a retried delivery) is ignored; a gap (an update lost with a dead feed, or
given up undelivered) makes the view *not ready* until the next digest. While it is not ready the hub reads the
scheduler itself, as without a feed: stale is never read as a state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from workflows.domain.loop import JobWatchInput
from workflows.domain.scheduler_feed import FeedUpdate
from workflows.domain.slurm import ClusterSnapshot, SlurmJob, SlurmNode

__all__ = ["ShardView", "view_says_changed"]

log = logging.getLogger("rebound.watch_hub")


class ShardView:
    """One shard's jobs and their nodes, as the feed last said (see the module docstring)."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.jobs: dict[int, SlurmJob] = {}
        self.nodes: dict[str, SlurmNode] = {}
        self.ready = False
        self.observed_at: datetime | None = None
        self.applied = 0
        """Updates applied (for tests and the shard's heartbeat)."""
        self._epoch = ""
        self._seq = 0
        self._parts: list[FeedUpdate] = []

    def apply(self, batch: Sequence[FeedUpdate]) -> None:
        """Apply the feed's updates in order (see the module docstring)."""
        for update in batch:
            self._apply(update)

    def _apply(self, u: FeedUpdate) -> None:
        if u.epoch == self._epoch and u.seq <= self._seq and (self.ready or not u.digest):
            return  # delivered again (a retried activity); a digest sent again to a view that is not ready applies
        if u.digest:
            self._digest_part(u)
            return
        if u.epoch != self._epoch or u.seq != self._seq + 1:
            if self.ready:
                log.warning(
                    "shard %s: feed update %s/%s missed (have %s/%s): reading the scheduler itself until "
                    "the next digest",
                    self.shard,
                    u.epoch,
                    u.seq,
                    self._epoch,
                    self._seq,
                )
            self.ready = False
            self._epoch, self._seq, self._parts = u.epoch, u.seq, []
            return
        self._seq = u.seq
        for job in u.jobs:
            self.jobs[job.job_id] = job
        for job_id in u.removed:
            self.jobs.pop(job_id, None)
        for node in u.nodes:
            self.nodes[node.name] = node
        self.observed_at = u.observed_at
        self.applied += 1

    def _digest_part(self, u: FeedUpdate) -> None:
        if u.part == 0:
            self._parts = [u]
        elif self._parts and self._parts[-1].epoch == u.epoch and self._parts[-1].seq + 1 == u.seq:
            self._parts.append(u)
        else:  # a part without its predecessors: wait for the next digest
            self._parts = []
            self.ready = False
            self._epoch, self._seq = u.epoch, u.seq
            return
        self._epoch, self._seq = u.epoch, u.seq
        if len(self._parts) < u.parts:
            return
        self.jobs = {j.job_id: j for p in self._parts for j in p.jobs}
        self.nodes = {n.name: n for p in self._parts for n in p.nodes}
        self.observed_at = u.observed_at
        self.ready = True
        self.applied += len(self._parts)
        self._parts = []

    def snapshot_of(self, job_id: int, node_names: Sequence[str]) -> ClusterSnapshot | None:
        """A snapshot of one job (absent when the feed says it is gone) and its nodes; None while not ready."""
        if not self.ready or self.observed_at is None:
            return None
        job = self.jobs.get(job_id)
        names = set(node_names) | set(job.nodes if job is not None else ())
        nodes = tuple(n for name in names if (n := self.nodes.get(name)) is not None)
        # model_construct: the parts are already validated models (this runs once per member per poll).
        return ClusterSnapshot.model_construct(
            observed_at=self.observed_at, jobs=(job,) if job is not None else (), nodes=nodes
        )


def view_says_changed(view: ClusterSnapshot, watch: JobWatchInput) -> bool:
    """The view shows the job gone, or in another state or attempt than its subscription knows: what the watch
    would report (``decide_poll`` rules 5-6), so it is confirmed with the scheduler before it is believed."""
    job = view.jobs[0] if view.jobs else None
    return job is None or job.state is not watch.last_state or job.restart_count != watch.last_restart_count
