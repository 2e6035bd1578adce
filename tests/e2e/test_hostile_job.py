"""End to end on the real lab, a hostile job: its comment asks for 100 restarts and names log files that are
symlinks to a root-only file outside the log roots (holding a fake ECC error) and to /etc/shadow.

What is checked is what an operator would see: the job's status (its budget, its CAPPED timeline entry, no
incident, no offset for the links) and the worker's own log (the refusal, with its reason). The lab's worker runs
with ``watch.log_roots`` = the lab's state directory (``deploy/local/services.py``) and the default ``optin.*``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from temporalio.client import Client

from tests.e2e.recovery_support import worker_log_mark, worker_log_since
from tests.lab_support import LabHandle, lab_rebound_settings
from workers import jobs_cli
from workers.client import connect
from workers.settings import Settings
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

#: Long enough for several polls and globs (every 2 s) after the watch starts.
WATCHED_FOR_S = 12.0


async def _status(client: Client, settings: Settings, job_id: int, timeout_s: float) -> JobRecoveryStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            st = await jobs_cli.query_status(client, settings, job_id)
            if st.state is RecoveryState.WATCHING:
                return st
        except ReboundError as e:
            if e.kind is not FailureKind.JOB_NOT_FOUND:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} was not watched within {timeout_s} s")
        await asyncio.sleep(0.3)


def _ecc_line() -> str:
    return (
        f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S.%f}"[:-3]
        + "Z RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    )


async def test_a_hostile_jobs_budget_is_capped_and_its_symlinked_logs_are_never_read(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    secret_dir = Path(tempfile.mkdtemp(prefix="rebound-hostile-", dir="/var/tmp"))  # outside the log roots
    secret = secret_dir / "root-only.log"
    secret.write_text(_ecc_line())
    secret.chmod(0o600)
    runs = lab.layout.runs / f"hostile-{uuid.uuid4().hex[:8]}"
    runs.mkdir(parents=True)
    (runs / "rank-0.log").symlink_to(secret)
    (runs / "rank-1.log").symlink_to("/etc/shadow")
    mark = worker_log_mark(lab)
    try:
        job = lab.submit_sleep_job(nodes=1, extra_args=["--comment", f"rebound: budget=100;logs={runs}/rank-*.log"])
        st = await _status(client, settings, job, timeout_s=60)
        with secret.open("a") as f:  # a new line after the watch began: read, it would be an incident
            f.write(_ecc_line())
        await asyncio.sleep(WATCHED_FOR_S)
        st = await jobs_cli.query_status(client, settings, job)

        assert st.restart_budget == 10
        assert [e.detail for e in st.timeline if e.event == "CAPPED"] == [
            "budget=100 capped at 10 by operator policy (optin.max_budget)"
        ]
        assert st.state is RecoveryState.WATCHING and st.incidents == ()
        assert not [p for p in st.log_offsets if p.startswith(str(runs))], st.log_offsets
        refused = [line for line in worker_log_since(lab, mark) if f"job {job}: log files not read" in line]
        assert refused, "the worker did not say why the job's logs were not read"
        assert "outside the log roots" in refused[0] and str(secret) in refused[0] and "/etc/shadow" in refused[0]
        print(f"\njob {job}: budget {st.restart_budget}; worker said: {refused[0][-300:]}")
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)
