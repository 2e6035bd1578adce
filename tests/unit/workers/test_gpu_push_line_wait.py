"""The agent holds an NVLink5 XID read through NVML (no Fatal/Nonfatal label) for the driver's labelled line where it
follows the kernel log: a Nonfatal line means nothing is pushed; no line in ``LINE_WAIT`` means the catalogue
decides (``workers/gpu_push.py``, ``workflows/policy/xid_copies.py``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.gpu.port import EventBatch
from workers import gpu_push
from workflows.domain.gpu import GpuEvent, GpuEventKind


class _Stream:
    """A node's event stream the test appends to while the push loop runs."""

    def __init__(self) -> None:
        self.events: list[GpuEvent] = []

    def add(self, event: GpuEvent) -> None:
        self.events.append(event.model_copy(update={"sequence": len(self.events) + 1}))

    def events_after(self, cursor: int) -> EventBatch:
        new = tuple(e for e in self.events if e.sequence > cursor)
        return EventBatch(events=new, next_cursor=len(self.events) or cursor)


def _xid(xid: int, source: str, fatal: bool | None = None) -> GpuEvent:
    later = datetime.now(UTC) + timedelta(seconds=10)  # past the start-up grace
    return GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=xid, source=source, observed_at=later, fatal=fatal)


async def _run(
    monkeypatch: pytest.MonkeyPatch,
    stream: _Stream,
    script: Any,
    *,
    followed: bool = True,
    pushed: list[GpuEvent] | None = None,
) -> list[GpuEvent]:
    pushed = [] if pushed is None else pushed

    async def record(event: GpuEvent, *_: Any) -> None:
        pushed.append(event)

    monkeypatch.setattr(gpu_push, "_push", record)
    monkeypatch.setattr(gpu_push, "LINE_WAIT", timedelta(seconds=0.3))
    stop = asyncio.Event()
    loop = asyncio.create_task(
        gpu_push.push_gpu_events(stream, None, None, "c", "n1", stop, poll_s=0.01, kernel_log_followed=followed)  # type: ignore[arg-type]
    )
    await script()
    await asyncio.sleep(0.5)  # past LINE_WAIT
    stop.set()
    await asyncio.wait_for(loop, timeout=5)
    return pushed


async def test_a_nonfatal_line_after_nvmls_event_pushes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Stream()

    async def script() -> None:
        stream.add(_xid(149, "nvml"))
        await asyncio.sleep(0.1)
        stream.add(_xid(149, "kernel log", fatal=False))

    assert await _run(monkeypatch, stream, script) == []


async def test_a_fatal_line_is_pushed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Stream()

    async def script() -> None:
        stream.add(_xid(149, "nvml"))
        await asyncio.sleep(0.1)
        stream.add(_xid(149, "kernel log", fatal=True))

    pushed = await _run(monkeypatch, stream, script)
    assert [(e.source, e.fatal) for e in pushed] == [("kernel log", True)]


async def test_a_line_before_nvmls_event_decides_too(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Stream()

    async def script() -> None:
        stream.add(_xid(149, "kernel log", fatal=False))
        await asyncio.sleep(0.05)
        stream.add(_xid(149, "nvml"))

    assert await _run(monkeypatch, stream, script) == []


async def test_no_line_in_time_the_catalogue_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Stream()
    pushed: list[GpuEvent] = []

    async def script() -> None:
        stream.add(_xid(149, "nvml"))
        await asyncio.sleep(0.1)
        assert pushed == []  # held for its line

    await _run(monkeypatch, stream, script, pushed=pushed)
    assert [(e.source, e.xid) for e in pushed] == [("nvml", 149)]


async def test_without_the_kernel_log_nothing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _Stream()
    pushed: list[GpuEvent] = []

    async def script() -> None:
        stream.add(_xid(149, "nvml"))
        await asyncio.sleep(0.1)
        assert len(pushed) == 1  # judged at once

    await _run(monkeypatch, stream, script, followed=False, pushed=pushed)
    assert [(e.source, e.xid) for e in pushed] == [("nvml", 149)]
