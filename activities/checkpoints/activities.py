"""The checkpoint activities JobRecovery calls before a restart: ``checkpoint_scan`` (what the job's checkpoint
directory holds, ``scan``) and ``checkpoint_quarantine`` (set a partial newest checkpoint aside, ``quarantine``).

Both run on the central worker, which must see the job's checkpoint directory (a shared file system). Neither fails
for a fact about the directory: an unreadable directory is ``error`` on the report, a refused quarantine is
``REFUSED`` on the result with its reason, because a retry would not change either. The file work runs in a thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporalio import activity

from activities.checkpoints.quarantine import quarantine_partial_newest
from activities.checkpoints.scan import scan_checkpoints
from workflows.domain.checkpoints import (
    CheckpointQuarantineInput,
    CheckpointQuarantineResult,
    CheckpointReport,
    CheckpointScanInput,
    QuarantineAction,
)

__all__ = ["checkpoint_quarantine", "checkpoint_scan"]


@activity.defn(name="checkpoint_scan")
async def checkpoint_scan(inp: CheckpointScanInput) -> CheckpointReport:
    """Discover and check every checkpoint in ``inp.dir``; the newest valid one, the incomplete ones."""
    return await asyncio.to_thread(scan_checkpoints, Path(inp.dir))


@activity.defn(name="checkpoint_quarantine")
async def checkpoint_quarantine(inp: CheckpointQuarantineInput) -> CheckpointQuarantineResult:
    """Set aside the partial checkpoints newer than the latest valid one in ``inp.dir`` (idempotent).

    Refused without the job's uid: the worker acts as root on the job's files only when it can check they are the
    job user's own.
    """
    if inp.expected_owner_uid is None:
        return CheckpointQuarantineResult(
            action=QuarantineAction.REFUSED, reason="the job's user id is unknown: its files' owner cannot be checked"
        )
    result = await asyncio.to_thread(quarantine_partial_newest, Path(inp.dir), inp.expected_owner_uid)
    activity.logger.info("checkpoint quarantine in %s: %s (%s)", inp.dir, result.action.value, result.reason)
    return result
