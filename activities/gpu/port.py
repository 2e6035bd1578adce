"""The GPU health port: what every GPU source offers, and the event-cursor contract they share.

A source samples every GPU on demand and collects discrete events (XIDs, lost GPUs) in the background. Callers
read events with a cursor: ``events_after(cursor)`` returns only events newer than the cursor plus the cursor to
pass next time, so a workflow polling a node agent never sees an event twice and notices when it fell behind.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from workflows.domain.gpu import GpuEvent, GpuSample

__all__ = ["EventBatch", "EventLog", "GpuSource"]


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Events newer than a cursor.

    Attributes:
        events: The events, oldest first, each with its ``sequence`` set.
        next_cursor: The cursor for the next read (the newest sequence the log has issued).
        missed: Events newer than the cursor that were already dropped from the bounded buffer.
    """

    events: tuple[GpuEvent, ...]
    next_cursor: int
    missed: int = 0


class EventLog:
    """A bounded, thread-safe buffer that numbers events and serves them by cursor.

    Sequence numbers start just above the wall-clock microseconds at construction, so the numbers of a
    restarted agent are larger than any cursor a caller got from the previous process: nothing new is skipped
    after a restart. A cursor larger than anything issued (a clock that went backwards) is treated as foreign
    and answered with everything buffered; that is the only case that can repeat events, and it errs towards
    reporting a fault twice rather than never.
    """

    def __init__(self, capacity: int = 1024, *, first_sequence: int | None = None) -> None:
        """Create an empty log.

        Args:
            capacity: Events kept; older ones are dropped and counted as missed by late readers.
            first_sequence: Base for the numbering (tests pin it); the first event gets ``first_sequence + 1``.
        """
        self._base = time.time_ns() // 1000 if first_sequence is None else first_sequence
        self._last = self._base
        self._events: deque[GpuEvent] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, event: GpuEvent) -> GpuEvent:
        """Number ``event`` and keep it; returns the numbered copy."""
        with self._lock:
            self._last += 1
            numbered = event.model_copy(update={"sequence": self._last})
            self._events.append(numbered)
            return numbered

    def after(self, cursor: int) -> EventBatch:
        """Events with ``sequence > cursor`` (all of them for a foreign cursor), oldest first."""
        with self._lock:
            if cursor > self._last:
                cursor = 0
            events = tuple(e for e in self._events if e.sequence > cursor)
            oldest_kept = self._events[0].sequence if self._events else self._last + 1
            missed = max(0, oldest_kept - max(cursor + 1, self._base + 1))
            return EventBatch(events=events, next_cursor=self._last, missed=missed)


class GpuSource(Protocol):
    """One node's (or one scrape target's) GPUs: samples on demand, events collected in the background.

    Implementations are synchronous and may block (NVML calls, HTTP); async callers run them in a thread.
    """

    @property
    def host(self) -> str:
        """The node whose GPUs this source reads."""
        ...

    def open(self) -> None:
        """Connect and start collecting events. Idempotent: a second call on an open source does nothing.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the GPUs cannot be read right now (no driver,
                no library); ``CONFIGURATION`` when the source cannot work at all here.
        """
        ...

    def driver_version(self) -> str:
        """The GPU driver version seen at open.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the source is not open.
        """
        ...

    def sample(self) -> list[GpuSample]:
        """Read every GPU once. Field-level failures are recorded in the samples, never raised.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the source is not open.
        """
        ...

    def events_after(self, cursor: int) -> EventBatch:
        """Events collected since ``cursor`` (0: all still buffered)."""
        ...

    def add_event(self, event: GpuEvent) -> GpuEvent:
        """Put an event another reader of this node saw (its kernel log) into this source's stream, numbered like
        the source's own: one stream per node, so pushes, fresh reads and cursors treat both alike. Thread-safe."""
        ...

    def close(self) -> None:
        """Stop collecting events and release the connection. Idempotent."""
        ...
