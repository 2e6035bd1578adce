"""Session fixture: the real test lab (Slurm daemons, Temporal dev server, node agents, worker)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from deploy.local.lab import Lab
from tests.lab_support import LabHandle, test_lab_config


@pytest.fixture(scope="session")
def lab_session() -> Iterator[LabHandle]:
    lab = Lab(test_lab_config())
    started = time.monotonic()
    lab.up(log=False)
    print(f"\ntest lab up in {time.monotonic() - started:.1f} s")
    handle = LabHandle(lab)
    yield handle
    if os.environ.get("REBOUND_KEEP_LAB") != "1":
        lab.down()


@pytest.fixture
def lab(lab_session: LabHandle) -> Iterator[LabHandle]:
    yield lab_session
    lab_session.cleanup()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.lab)
