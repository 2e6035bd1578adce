"""Red team, operators: a real non-root Unix user on the lab tries the operators' commands through the real CLI.

Each outcome is checked by a fresh observation (the Fleet's or the job's ``status`` query), not by the exit code
alone. The lab's operator is whoever runs it (root here), as MUNGE proves it; ``--as lab`` changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.temporal import rebound_workflows
from tests.lab_support import LabHandle, lab_rebound_settings, operator_env
from tests.security.redteam import REDTEAM_USER, RedTeamUser
from workers.client import connect
from workers.console import EXIT_REFUSED
from workers.fleet import start_fleet
from workflows.domain.fleet import FleetMode, FleetStatus

pytestmark = [pytest.mark.lab]


@pytest_asyncio.fixture
async def fleet(security_lab: LabHandle) -> AsyncIterator[Client]:
    settings = lab_rebound_settings(security_lab)
    client = await connect(settings.temporal)
    await start_fleet(client, settings)  # attaches to a running Fleet
    yield client


async def _status(client: Client, lab: LabHandle) -> FleetStatus:
    return await rebound_workflows.query_fleet_status(client, lab.cfg.cluster_name, timeout_s=10)


def _as_root(lab: LabHandle, *args: str) -> tuple[int, str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "workers.cli", *args], env=operator_env(lab), capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    return out.returncode, out.stdout + out.stderr


async def test_a_non_operator_cannot_reset_the_breaker_or_change_the_mode(
    security_lab: LabHandle, fleet: Client, redteam_user: RedTeamUser
) -> None:
    lab, env = security_lab, operator_env(security_lab)
    code, out = _as_root(lab, "mode", "act")
    assert code == 0, out
    before = await _status(fleet, lab)
    assert before.state.mode is FleetMode.ACT

    reset = redteam_user.rebound("breaker", "reset", "--as", "lab", env=env)
    mode = redteam_user.rebound("mode", "observe", "--as", "lab", env=env)
    for attempt in (reset, mode):
        assert attempt.returncode == EXIT_REFUSED, attempt
        assert f"{REDTEAM_USER} is not an operator" in attempt.stderr, attempt.stderr

    after = await _status(fleet, lab)
    assert after.state.mode is FleetMode.ACT, "a non-operator changed the mode"
    assert after.state.breaker_reset_at == before.state.breaker_reset_at, "a non-operator reset the breaker"
    refused = [e for e in after.state.auth.events if e.user == REDTEAM_USER]
    assert len(refused) >= 2 and not any(e.allowed for e in refused)

    # The operator (root, as MUNGE proves; --as is ignored) does both.
    code, out = _as_root(lab, "breaker", "reset", "--as", "lab")
    assert code == 0, out
    code, out = _as_root(lab, "mode", "observe", "--as", "lab")
    assert code == 0, out
    done = await _status(fleet, lab)
    assert done.state.mode is FleetMode.OBSERVE and done.state.breaker_reset_at != before.state.breaker_reset_at
    assert done.state.auth.events[-1].user == "root" and done.state.auth.events[-1].allowed
    _as_root(lab, "mode", "act")  # the lab acts


async def test_the_operator_list_is_live(security_lab: LabHandle, fleet: Client, redteam_user: RedTeamUser) -> None:
    lab, env = security_lab, operator_env(security_lab)
    config = lab.layout.rebound_config
    original = config.read_text()
    try:
        config.write_text(f'[fleet]\noperators = ["root", "{REDTEAM_USER}"]\n')
        granted = redteam_user.rebound("breaker", "reset", env=env)
        assert granted.returncode == 0, granted  # no restart of anything
        config.write_text(original)
        revoked = redteam_user.rebound("breaker", "reset", env=env)
        assert revoked.returncode == EXIT_REFUSED, revoked
    finally:
        config.write_text(original)
    st = await _status(fleet, lab)
    changes = [e for e in st.state.auth.events if e.action == "operators-changed"]
    assert any(f"added: {REDTEAM_USER}" in e.detail for e in changes)
    assert any(f"removed: {REDTEAM_USER}" in e.detail for e in changes)


# Pausing another user's job as a non-operator is refused the same way (one update, operator_request): the
# workflow test with a real munged and a real non-root user's credential covers it
# (tests/workflows/test_job_recovery.py::test_a_non_operator_cannot_pause_a_job); a lab job would cost ~35 s.
