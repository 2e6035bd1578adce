"""Session fixture: the real test lab (Slurm daemons, Temporal dev server, node agents, worker)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime

import pytest

from deploy.local.lab import Lab
from tests.e2e import recording
from tests.lab_support import LabHandle, end_fleet, test_lab_config


@pytest.fixture(scope="session")
def lab_session() -> Iterator[LabHandle]:
    lab = Lab(test_lab_config())
    started = time.monotonic()
    lab.up(log=False)
    print(f"\ntest lab up in {time.monotonic() - started:.1f} s")
    handle = LabHandle(lab)
    asyncio.run(end_fleet(handle, "new test session"))
    if recording.recording_dir() is not None:
        asyncio.run(recording.start_fresh_cluster_watch(handle))
    yield handle
    if os.environ.get("REBOUND_KEEP_LAB") != "1":
        lab.down()


@pytest.fixture
def lab(lab_session: LabHandle, request: pytest.FixtureRequest) -> Iterator[LabHandle]:
    asyncio.run(end_fleet(lab_session, "new test"))
    started = datetime.now(UTC)
    yield lab_session
    out_dir = recording.recording_dir()
    call = request.node.stash.get(_CALL_REPORT, None)
    passed = call is not None and call.passed
    if out_dir is not None and passed and recording.is_recorded(request.node.name):
        asyncio.run(recording.record_scenario(lab_session, request.node.name, started, out_dir))
    lab_session.cleanup()


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the call's report on the item: only a scenario that passed is recorded."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)
    if recording.recording_dir() is not None:  # recording: only the scenarios that yield histories
        skipped = [item for item in items if item.get_closest_marker("lab") and not recording.is_recorded(item.name)]
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if item not in skipped]
