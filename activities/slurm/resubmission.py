"""Resubmission's activities (ADR 014): capture a job's submission when its watch begins; submit it again.

The batch script and the environment stay on the worker, in files under ``<state_dir>/submissions/<cluster>/
<job_id>/`` (directory 0700, files 0600): workflow history carries their path, size and digest, never their
content (a script can be megabytes; an environment can hold secrets). The capture and the resubmission must
therefore run where that directory is: the central worker's state directory (shared by every central worker
when there are several).

The environment is the one slurmctld saved with the job (``StateSaveLocation/hash.N/job.J/environment``), which
the CLI adapter reads when the worker runs on the controller's host as root or SlurmUser. Elsewhere it is not
captured (reading the batch step's ``/proc/<pid>/environ`` through a node agent would carry it through workflow
history in clear): the resubmitted job then gets a minimal login environment (``submission.job_environment``),
and the timeline says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.errors import classified_errors
from activities.heartbeating import heartbeating_throughout
from activities.slurm.port import ResubmitRequest, SchedulerPort
from activities.slurm.submission import job_environment, parse_environ, token_in
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.submission import (
    CaptureSubmissionInput,
    CaptureSubmissionResult,
    ResubmitInput,
    ResubmitOutcome,
    SubmissionFacts,
)

__all__ = ["MAX_SCRIPT_BYTES", "SubmissionActivities"]

log = logging.getLogger(__name__)

#: Slurm's own default ``max_script_size`` (4 MB): a larger script cannot have been submitted anyway.
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
_NOT_CAPTURED = "not captured (this scheduler backend does not give it)"


class SubmissionActivities:
    """Capture and resubmission, bound to the worker's scheduler port and state directory."""

    def __init__(self, scheduler: SchedulerPort, state_dir: Path) -> None:
        self._scheduler = scheduler
        self._root = state_dir / "submissions"

    @activity.defn(name="slurm_capture_submission")
    async def capture_submission(self, inp: CaptureSubmissionInput) -> CaptureSubmissionResult:
        """The job's options from Slurm, its batch script copied under the state directory.

        A job Slurm keeps no script for, or one the backend cannot read, is not an error of the workflow: the
        result says why, and the job simply cannot be resubmitted.
        """
        with classified_errors():
            try:
                sub = await self._scheduler.read_submission(inp.job_id)
            except ReboundError as e:
                if e.kind.retryable:
                    raise
                return CaptureSubmissionResult(note=f"{e.kind.value}: {e.message}")
            if len(sub.script) > MAX_SCRIPT_BYTES:
                return CaptureSubmissionResult(note=f"batch script of {len(sub.script)} bytes is over the cap")
            where = self._root / _safe(inp.cluster) / str(inp.job_id)
            script = _write_private(where, "script", sub.script)
            environment = (
                "" if sub.environment is None else str(_write_private(where, "environ", _pack(sub.environment)))
            )
        facts = SubmissionFacts(
            **sub.model_dump(exclude={"script", "environment", "environment_note"}),
            script_path=str(script),
            script_sha256=hashlib.sha256(sub.script).hexdigest(),
            script_bytes=len(sub.script),
            environment_path=environment,
            environment_note=sub.environment_note or _NOT_CAPTURED,
            captured_at=datetime.now(UTC),
        )
        log.info("captured the submission of job %s (%d byte script)", inp.job_id, len(sub.script))
        return CaptureSubmissionResult(facts=facts)

    @activity.defn(name="slurm_resubmit_job")
    @heartbeating_throughout
    async def resubmit_job(self, inp: ResubmitInput) -> ResubmitOutcome:
        """Submit the job again as its owner, off ``inp.exclude``; adopt a job an earlier attempt submitted.

        The adapter looks for a job carrying ``inp.token`` on a fresh listing before submitting, so a retry after
        a crash between ``sbatch`` and this activity's answer adopts the job instead of submitting a second one.
        The new job is then verified on a fresh observation.
        """
        facts = inp.facts
        log.info("resubmit job %s excluding %s key=%s token=%s", facts.job_id, inp.exclude, inp.key, inp.token)
        with classified_errors():
            script = _read_script(facts)
            env, _ = job_environment(_read_environment(facts), user_id=facts.user_id)
            request = ResubmitRequest(
                **facts.model_dump(include={"job_id", "user", "user_id", "group_id", "working_directory", "options"}),
                script=script,
                environment=env,
                exclude=inp.exclude,
                token=inp.token,
                not_before=inp.reserved_at,
            )
            result = await self._scheduler.resubmit_excluding(request)
            fresh = await self._scheduler.get_job(result.job_id)
            if fresh is None or token_in(fresh.comment) != inp.token or fresh.user_id != facts.user_id:
                raise ReboundError(  # retried: the next attempt lists again and adopts what carries the token
                    FailureKind.SCHEDULER_BUSY, f"resubmitted job {result.job_id} not visible as expected yet"
                )
            if not set(inp.exclude) <= set(fresh.excluded_nodes):
                raise ReboundError(
                    FailureKind.SCHEDULER_REJECTED,
                    f"resubmitted job {result.job_id} excludes {fresh.excluded_nodes}, not {inp.exclude}",
                )
        return ResubmitOutcome(
            job_id=result.job_id,
            adopted=result.adopted,
            state=fresh.state,
            excluded_nodes=fresh.excluded_nodes,
            verified_at=datetime.now(UTC),
        )


def _pack(env: dict[str, str]) -> bytes:
    """NUL-separated, as ``/proc/<pid>/environ`` (``submission.parse_environ`` reads it back)."""
    return b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items())


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def _write_private(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``directory/name`` readable by the worker's user only (written whole, then renamed)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    tmp = directory / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
    return path


def _read_environment(facts: SubmissionFacts) -> dict[str, str] | None:
    if not facts.environment_path:
        return None
    try:
        return parse_environ(Path(facts.environment_path).read_bytes())
    except OSError as e:
        raise ReboundError(
            FailureKind.CONFIGURATION, f"job {facts.job_id}: the captured environment is not readable here ({e})"
        ) from e


def _read_script(facts: SubmissionFacts) -> bytes:
    try:
        script = Path(facts.script_path).read_bytes()
    except OSError as e:
        raise ReboundError(
            FailureKind.CONFIGURATION,
            f"job {facts.job_id}: the captured batch script is not readable on this worker ({e}); the capture and "
            "the resubmission must share the worker's state directory",
        ) from e
    if hashlib.sha256(script).hexdigest() != facts.script_sha256:
        raise ReboundError(
            FailureKind.CONFIGURATION, f"job {facts.job_id}: the captured batch script changed since its capture"
        )
    return script
