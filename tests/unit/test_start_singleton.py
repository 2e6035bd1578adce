"""A singleton workflow's start rides out a Temporal server that does not serve its namespace yet, for a bound."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from activities.temporal import rebound_workflows
from activities.temporal.rebound_workflows import start_watch_shard
from workflows.domain.watch_hub import WatchShardInput


class _Client:
    """Answers ``start_workflow`` with the queued errors first, then a handle."""

    def __init__(self, errors: list[RPCError]) -> None:
        self.errors = errors
        self.calls = 0

    async def start_workflow(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "handle"


def _missing() -> RPCError:
    return RPCError("Namespace default is not found.", RPCStatusCode.NOT_FOUND, b"")


def _inp() -> WatchShardInput:
    return WatchShardInput(
        cluster="lab", shard=3, shards=32, watch_task_queue="rebound-watch", shard_queue_prefix="rebound-watch-shard"
    )


async def test_a_namespace_not_served_yet_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("activities.temporal.rebound_workflows.asyncio.sleep", _no_sleep)
    client = _Client([_missing(), _missing()])
    handle: object = await start_watch_shard(client, _inp(), task_queue="q")  # type: ignore[arg-type]
    assert handle == "handle"
    assert client.calls == 3


async def test_a_namespace_still_missing_after_the_wait_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rebound_workflows, "NAMESPACE_WAIT_S", 0.0)
    client = _Client([_missing()])
    with pytest.raises(RPCError, match="not found"):
        await start_watch_shard(client, _inp(), task_queue="q")  # type: ignore[arg-type]
    assert client.calls == 1


async def test_other_errors_are_raised_at_once() -> None:
    client = _Client([RPCError("denied", RPCStatusCode.PERMISSION_DENIED, b"")])
    with pytest.raises(RPCError, match="denied"):
        await start_watch_shard(client, _inp(), task_queue="q")  # type: ignore[arg-type]
    assert client.calls == 1


async def _no_sleep(_: float) -> None:
    return None
