"""Heartbeats for an activity whose work is one long await (a scrape, a scan in a thread): a worker that dies in
the middle is noticed within the activity's heartbeat timeout, and the work retried on another worker, instead of
after its start-to-close bound (seconds, not minutes)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from temporalio import activity

__all__ = ["HEARTBEAT_EVERY_S", "heartbeating", "heartbeating_throughout"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Well inside the shortest heartbeat timeout given to such activities (10 s, ``workflows.options``).
HEARTBEAT_EVERY_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating(
    every_s: float = HEARTBEAT_EVERY_S, details: Callable[[], Sequence[Any]] | None = None
) -> AsyncIterator[None]:
    """Heartbeat at once and then every ``every_s`` while the block runs (the event loop must stay free: run
    blocking work in a thread). ``details``, when given, is called at each beat for the heartbeat's details (a
    progress count an operator sees in the UI's pending activity)."""

    async def beat() -> None:
        while True:
            activity.heartbeat(*(details() if details is not None else ()))
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def heartbeating_throughout(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """An activity method that heartbeats from its start to its end (``heartbeating`` around the whole call): for
    short actions on the cluster whose retry after a worker's death should wait seconds (their heartbeat timeout),
    not their start-to-close bound. Put it under ``@activity.defn``."""

    @functools.wraps(fn)
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        async with heartbeating():
            return await fn(*args, **kwargs)

    return run
