"""``heartbeating``: an activity whose work is one long await heartbeats while it runs, and stops after."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.heartbeating import heartbeating


@activity.defn
async def _slow_work() -> str:
    async with heartbeating(every_s=0.05):
        await asyncio.sleep(0.3)
    await asyncio.sleep(0.2)  # after the block: no more heartbeats
    return "done"


async def test_heartbeats_while_the_block_runs_and_not_after() -> None:
    env = ActivityEnvironment()
    beats: list[float] = []
    loop = asyncio.get_running_loop()
    env.on_heartbeat = lambda *_: beats.append(loop.time())
    started = loop.time()
    assert await env.run(_slow_work) == "done"
    assert len(beats) >= 3  # at once, then every 0.05 s for 0.3 s
    assert beats[0] - started < 0.1
    assert max(beats) - started < 0.4  # none during the last 0.2 s


@activity.defn
async def _counting_work() -> int:
    done = 0
    async with heartbeating(every_s=0.05, details=lambda: (done, 3)):
        for _ in range(3):
            await asyncio.sleep(0.08)
            done += 1
    return done


async def test_details_are_read_at_each_beat() -> None:
    env = ActivityEnvironment()
    details: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *d: details.append(tuple(d))
    assert await env.run(_counting_work) == 3
    assert details[0] == (0, 3)  # the first beat, before any work
    assert (1, 3) in details or (2, 3) in details  # later beats see the progress
    assert all(total == 3 for _, total in details)
