"""The security suite's lab: the test lab (tests/lab_support.py) with its TLS proxy, brought up once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from deploy.local.lab import Lab
from tests.lab_support import LabHandle, test_lab_config


@pytest.fixture(scope="session")
def security_lab() -> Iterator[LabHandle]:
    """The running test lab (idempotent: `up` starts only what is not running, e.g. after tests/e2e)."""
    lab = Lab(test_lab_config())
    lab.up(log=False)
    yield LabHandle(lab)
    if os.environ.get("REBOUND_KEEP_LAB") != "1":
        lab.down()
