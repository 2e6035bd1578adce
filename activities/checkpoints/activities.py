"""The checkpoint activities JobRecovery calls before a restart: ``checkpoint_scan`` (what the job's checkpoint
directory holds, ``scan``) and ``checkpoint_quarantine`` (set a partial newest checkpoint aside, ``quarantine``).

Both run on the central worker, which must see the job's checkpoint directory (a shared file system). Neither fails
for a fact about the directory: an unreadable directory is ``error`` on the report, a refused quarantine is
``REFUSED`` on the result with its reason, because a retry would not change either. The file work runs in a thread.

The directory is the job's choice (``ckpt=`` in its comment) and the worker usually runs as root, so both apply the
policy that bounds the job's log files (``watch.log_roots``, ``watch.log_require_owner``; the rule is
``activities.logs.access``): without it a job could make the worker list, read the structure of, or rename files
anywhere the worker can reach.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from temporalio import activity

from activities.checkpoints.quarantine import quarantine_partial_newest
from activities.checkpoints.scan import scan_checkpoints
from activities.heartbeating import heartbeating
from activities.logs.access import LogAccess
from activities.logs.job_logs import LogPolicy
from workflows.domain.checkpoints import (
    CheckpointQuarantineInput,
    CheckpointQuarantineResult,
    CheckpointReport,
    CheckpointScanInput,
    QuarantineAction,
)

__all__ = ["CheckpointActivities", "directory_refusal"]

_log = logging.getLogger(__name__)


def directory_refusal(access: LogAccess | None, directory: str) -> str | None:
    """Why the job's checkpoint directory may not be touched under ``access``; None when it may.

    The roots are judged on the directory's real path (symlinks resolved); the owner on the directory itself. A
    directory whose owner cannot be checked (it cannot be stat'ed) is refused only when an owner is required:
    otherwise the scan reports it missing or unreadable itself.
    """
    if access is None:
        return None
    reason = access.check_path(directory)
    if reason is not None:
        return reason
    try:
        uid = os.stat(directory).st_uid
    except OSError as e:
        return f"cannot check its owner: {e.strerror or e}" if access.owner_uid is not None else None
    return access.check_owner(uid)


class CheckpointActivities:
    """``checkpoint_scan`` and ``checkpoint_quarantine`` under the worker's file access policy.

    Args:
        logs: The worker's policy for files a job names (the same object the log watchers use).
    """

    def __init__(self, logs: LogPolicy) -> None:
        self._logs = logs

    def scan(self, directory: Path, owner_uid: int | None) -> CheckpointReport:
        """``scan_checkpoints`` under the access policy: the one path for the activity and the resume check."""
        refused = directory_refusal(self._logs.access_for_user(owner_uid), str(directory))
        if refused is not None:
            _log.warning("checkpoint directory %s not scanned: %s", directory, refused)
            return CheckpointReport(dir=str(directory), format=None, latest_valid=None, error=f"not scanned: {refused}")
        return scan_checkpoints(directory)

    @activity.defn(name="checkpoint_scan")
    async def checkpoint_scan(self, inp: CheckpointScanInput) -> CheckpointReport:
        """Discover and check every checkpoint in ``inp.dir``; the newest valid one, the incomplete ones."""
        async with heartbeating():  # a slow file system keeps the scan alive; a dead worker is retried in seconds
            return await asyncio.to_thread(self.scan, Path(inp.dir), inp.expected_owner_uid)

    @activity.defn(name="checkpoint_quarantine")
    async def checkpoint_quarantine(self, inp: CheckpointQuarantineInput) -> CheckpointQuarantineResult:
        """Set aside the partial checkpoints newer than the latest valid one in ``inp.dir`` (idempotent).

        Refused without the job's uid: the worker acts as root on the job's files only when it can check they are
        the job user's own. Refused too where the access policy refuses the directory.
        """
        if inp.expected_owner_uid is None:
            return CheckpointQuarantineResult(
                action=QuarantineAction.REFUSED,
                reason="the job's user id is unknown: its files' owner cannot be checked",
            )
        refused = directory_refusal(self._logs.access_for_user(inp.expected_owner_uid), inp.dir)
        if refused is not None:
            activity.logger.warning("checkpoint directory %s not touched: %s", inp.dir, refused)
            return CheckpointQuarantineResult(action=QuarantineAction.REFUSED, reason=f"not touched: {refused}")
        async with heartbeating():
            result = await asyncio.to_thread(quarantine_partial_newest, Path(inp.dir), inp.expected_owner_uid)
        activity.logger.info("checkpoint quarantine in %s: %s (%s)", inp.dir, result.action.value, result.reason)
        return result
