"""End to end on the real lab: which of a job's files Rebound reads, and from where (``docs/detection.md``).

* A log the job appends to already holds an earlier run's crash (written before the job was submitted): it
  must give no incident and drain nothing while the job keeps running.
* A job with no ``logs=`` is read from Slurm's default ``slurm-%j.out`` in its working directory: a crash it
  prints there (while the job keeps running, so the scheduler has nothing to say) is detected.

Both jobs opt in with their comment; the lab's own worker (ClusterWatch) discovers them.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path

from temporalio.client import Client

from tests.lab_support import LabHandle, lab_rebound_settings
from workers import jobs_cli
from workers.client import connect
from workers.settings import Settings
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.incident import AnomalyKind, EvidenceSource
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState

# An earlier run's last words: a user error that Rebound detects at once when it reads it (test 2 shows it does).
CRASH = [
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "ZeroDivisionError: division by zero",
]
QUIET_S = 12.0
"""How long the appended job is watched for a false incident: many watch polls (the lab polls every 0.5-1 s)."""


async def _monitored(client: Client, settings: Settings, job_id: int, timeout_s: float) -> JobRecoveryStatus:
    """The job's JobRecovery status, once discovery has started it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await jobs_cli.query_status(client, settings, job_id)
        except ReboundError as e:
            if e.kind is not FailureKind.JOB_NOT_FOUND or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


def _job_dir(lab: LabHandle, name: str) -> Path:
    out = lab.layout.runs / "logfiles" / f"{name}-{time.time_ns()}"
    out.mkdir(parents=True)
    return out


def _echo(lines: list[str], target: str = "") -> str:
    redirect = f" >> {shlex.quote(target)}" if target else ""
    return "; ".join(f"echo {shlex.quote(line)}{redirect}" for line in lines)


def _drained(lab: LabHandle) -> list[str]:
    return [n for n, state in lab.lab.slurm.node_states().items() if "drain" in state or "drng" in state]


async def test_an_old_crash_line_in_an_appended_log_gives_no_incident(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    out = _job_dir(lab, "appended")
    log = out / "train.log"
    log.write_text("step=40 loss=1.2\n" + "\n".join(CRASH) + "\n")  # yesterday's run, killed by its bug
    # Slurm's start_time has whole seconds: a file born in the attempt's first second counts as its own.
    await asyncio.sleep(1.2)
    # The job appends to the same log, as a trainer with logging.FileHandler (mode "a") does.
    steps = f"for i in $(seq 1 600); do echo step=$i loss=1.0 >> {shlex.quote(str(log))}; sleep 1; done"
    job = int(
        lab.slurm(
            "sbatch", "--parsable", "-N1", "--gres=gpu:1", "--requeue", "-J", "appended",
            f"--output={out}/slurm-%j.out", "--comment", f"rebound: logs={log}", "--wrap", steps,
        ).strip().split(";")[0]
    )  # fmt: skip
    lab.track(job)

    st = await _monitored(client, settings, job, timeout_s=15)
    # The workflow starts in STARTING (it anchors the job's logs, then starts its watch): wait for WATCHING, then
    # stay quiet. Never an incident, in either.
    started = time.monotonic()
    while st.state is RecoveryState.STARTING and time.monotonic() - started < 30:
        assert st.incidents == (), [i.anomaly.summary for i in st.incidents]
        await asyncio.sleep(0.2)
        st = await jobs_cli.query_status(client, settings, job)
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        st = await jobs_cli.query_status(client, settings, job)
        assert st.incidents == (), [i.anomaly.summary for i in st.incidents]
        assert st.state is RecoveryState.WATCHING, st.state
        await asyncio.sleep(0.5)
    assert _drained(lab) == []
    assert "RUNNING" in lab.slurm("squeue", "-h", "-j", str(job), "-o", "%T")
    assert log.read_text().count("step=") > 3  # the job did append while it was watched


async def test_a_crash_in_the_default_slurm_out_of_a_job_without_logs_is_detected(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    client = await connect(settings.temporal)
    out = _job_dir(lab, "default-out")
    # No --output: Slurm writes slurm-<id>.out in the working directory. The job keeps running after its crash
    # line, so only the file can tell.
    script = f"sleep 4; {_echo(CRASH)}; sleep 600"
    job = int(
        lab.slurm(
            "sbatch", "--parsable", "-N1", "--gres=gpu:1", "--requeue", "-J", "default-out", f"--chdir={out}",
            "--comment", "rebound", "--wrap", script,
        ).strip().split(";")[0]
    )  # fmt: skip
    lab.track(job)

    await _monitored(client, settings, job, timeout_s=15)
    deadline = time.monotonic() + 30
    while True:
        st = await jobs_cli.query_status(client, settings, job)
        if st.incidents:
            break
        assert time.monotonic() < deadline, f"no incident; state {st.state}"
        await asyncio.sleep(0.5)
    anomaly = st.incidents[0].anomaly
    assert anomaly.kind is AnomalyKind.RANK_CRASH, anomaly
    assert any(e.source is EvidenceSource.LOGS and "ZeroDivisionError" in e.text for e in anomaly.evidence), anomaly
    assert (out / f"slurm-{job}.out").exists()
    assert _drained(lab) == []  # a user's bug drains nothing
