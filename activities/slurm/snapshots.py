"""One scheduler snapshot shared by every watcher of a worker.

ClusterWatch and every per-job watcher of a worker ask ``SnapshotCache.get()`` each poll; the cache makes at
most one ``snapshot()`` call per ``max_age_s`` however many of them ask, so the scheduler sees one ``squeue``
plus one ``sinfo`` per interval for the whole worker instead of one per job (ARCHITECTURE.md section 2).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from activities.slurm.port import SchedulerReads
from workflows.domain.errors import ReboundError
from workflows.domain.slurm import ClusterSnapshot

__all__ = ["SnapshotCache"]


class SnapshotCache:
    """Serves the latest cluster snapshot while it is younger than ``max_age_s``; fetches at most one at a time.

    Age is counted from when the fetch started, matching ``ClusterSnapshot.observed_at`` (taken before the
    scheduler calls), so a snapshot is never treated as fresher than it is. A classified failure
    (``ReboundError``) is shared the same way: while the scheduler is down, the waiting watchers get the same
    error instead of each sending its own doomed request.

    Attributes:
        fetches: How many times the scheduler was asked (for tests and benchmarks).
    """

    def __init__(
        self, reads: SchedulerReads, max_age_s: float = 1.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Wrap ``reads``.

        Args:
            reads: The scheduler port (any adapter); only its ``snapshot()`` is used.
            max_age_s: Reuse a snapshot (or a failure) while it is younger than this; 0 fetches on every call,
                though still one at a time.
            clock: Monotonic seconds; injected by tests.

        Raises:
            ValueError: ``max_age_s`` is negative.
        """
        if max_age_s < 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s}")
        self.max_age_s = max_age_s
        self.fetches = 0
        self._reads = reads
        self._clock = clock
        self._lock = asyncio.Lock()
        self._snapshot: ClusterSnapshot | None = None
        self._error: ReboundError | None = None
        self._taken_at = -math.inf

    async def get(self, *, max_age_s: float | None = None) -> ClusterSnapshot:
        """The latest snapshot, fetched now if the cached one is too old.

        Args:
            max_age_s: A tighter bound for this call (e.g. 0 to verify an action against a fresh observation);
                the cache's own bound when None. It never loosens the cache's bound.

        Returns:
            A snapshot whose fetch started less than the bound ago.

        Raises:
            ReboundError: The scheduler could not be read (the same error for every caller within the bound).
        """
        bound = self.max_age_s if max_age_s is None else min(max_age_s, self.max_age_s)
        # The lock makes late callers wait for the fetch in flight and then reuse it, instead of starting more.
        async with self._lock:
            if self._clock() - self._taken_at < bound:
                if self._error is not None:
                    raise self._error
                if self._snapshot is not None:
                    return self._snapshot
            return await self._fetch()

    async def taken_after(self, moment: float) -> ClusterSnapshot:
        """A snapshot whose fetch started at or after ``moment`` (this cache's clock): a fresh observation.

        Callers that ask at once share one fetch (a thousand JobRecoveries starting together cost a few listings,
        not a thousand), and none gets a listing that was already under way before it asked, so the answer is as
        fresh as its own ``squeue`` would have been.

        Raises:
            ReboundError: The scheduler could not be read by a fetch that started after ``moment``.
        """
        async with self._lock:
            if self._taken_at >= moment:
                if self._error is not None:
                    raise self._error
                if self._snapshot is not None:
                    return self._snapshot
            return await self._fetch()

    async def _fetch(self) -> ClusterSnapshot:
        """Ask the scheduler now and keep the answer (or its classified failure); the caller holds the lock."""
        started = self._clock()
        self.fetches += 1
        try:
            snapshot = await self._reads.snapshot()
        except ReboundError as e:
            self._snapshot, self._error, self._taken_at = None, e, started
            raise
        self._snapshot, self._error, self._taken_at = snapshot, None, started
        return snapshot

    def now(self) -> float:
        """This cache's clock, for ``taken_after``."""
        return self._clock()
