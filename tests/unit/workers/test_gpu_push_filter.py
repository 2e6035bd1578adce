"""The node agent pushes faults, not evidence: an XID the driver's line says needs nothing (an NVLink5 XID labelled
Nonfatal, XID 154 back to None) or the catalogue calls informational interrupts no job."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.gpu.port import EventBatch
from tests.unit.policy.test_xid_line import FATAL_149, NONFATAL_145, XID154_BACK_TO_NONE, XID154_REBOOT
from workers import gpu_push
from workflows.domain.gpu import GpuEvent, GpuEventKind
from workflows.policy.xid_line import xid_line_facts


def _from_line(line: str, sequence: int, at: datetime) -> GpuEvent:
    facts = xid_line_facts(line)
    assert facts is not None
    return GpuEvent(
        kind=GpuEventKind.XID,
        host="n1",
        index=0,
        xid=facts.xid,
        fatal=facts.fatal,
        recovery_action=facts.recovery_to,
        source="kmsg",
        observed_at=at,
        sequence=sequence,
    )


class _Source:
    def __init__(self, events: tuple[GpuEvent, ...]) -> None:
        self._events = events

    def events_after(self, cursor: int) -> EventBatch:
        new = tuple(e for e in self._events if e.sequence > cursor)
        return EventBatch(events=new, next_cursor=max((e.sequence for e in self._events), default=cursor))


async def test_only_faults_are_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    later = datetime.now(UTC) + timedelta(seconds=10)  # past the start-up grace
    lines = (NONFATAL_145, FATAL_149, XID154_BACK_TO_NONE, XID154_REBOOT)
    events = [_from_line(line, i + 1, later) for i, line in enumerate(lines)]
    events.append(GpuEvent(kind=GpuEventKind.XID, host="n1", index=1, xid=43, observed_at=later, sequence=5))
    events.append(GpuEvent(kind=GpuEventKind.XID, host="n1", index=1, xid=79, observed_at=later, sequence=6))
    pushed: list[GpuEvent] = []
    stop = asyncio.Event()

    async def record(event: GpuEvent, *_: Any) -> None:
        pushed.append(event)
        if event.sequence == 6:
            stop.set()

    monkeypatch.setattr(gpu_push, "_push", record)
    source: Any = _Source(tuple(events))
    await asyncio.wait_for(gpu_push.push_gpu_events(source, None, None, "c", "n1", stop, poll_s=0.01), timeout=5)  # type: ignore[arg-type]
    assert [(e.xid, e.sequence) for e in pushed] == [(149, 2), (154, 4), (79, 6)]
