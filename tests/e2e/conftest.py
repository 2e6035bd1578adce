"""Session fixture: the real test lab (Slurm daemons, Temporal dev server, node agents, worker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

import pytest
from temporalio.service import RPCError

from deploy.local.lab import Lab
from tests.lab_support import LabHandle, lab_rebound_settings, test_lab_config
from workers.client import connect
from workflows.constants import fleet_workflow_id


@pytest.fixture(scope="session")
def lab_session() -> Iterator[LabHandle]:
    lab = Lab(test_lab_config())
    started = time.monotonic()
    lab.up(log=False)
    print(f"\ntest lab up in {time.monotonic() - started:.1f} s")
    handle = LabHandle(lab)
    asyncio.run(_fresh_fleet(handle))
    yield handle
    if os.environ.get("REBOUND_KEEP_LAB") != "1":
        lab.down()


async def _fresh_fleet(handle: LabHandle) -> None:
    """End a Fleet left running by an earlier session (the lab's Temporal state survives ``lab down``): it carries
    that session's code and settings, and its history would not replay on changed code. The first request of this
    session starts a new one (signal-with-start)."""
    settings = lab_rebound_settings(handle)
    client = await connect(settings.temporal)
    with contextlib.suppress(RPCError):
        await client.get_workflow_handle(fleet_workflow_id(settings.cluster_name)).terminate(reason="new test session")


@pytest.fixture
def lab(lab_session: LabHandle) -> Iterator[LabHandle]:
    yield lab_session
    lab_session.cleanup()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)
