"""The worker's policy for reading the files jobs name (``activities.logs.job_logs.LogPolicy``), from its settings.

A job's owner names its log, heartbeat and checkpoint paths (its comment, its ``--output``), and the worker reads
them, usually as root, and quotes what it read in incident evidence. Without ``watch.log_roots`` any file on the
worker's host could be read that way, so a worker refuses to start without it (the lab sets it:
``deploy/local/services.py``).
"""

from __future__ import annotations

from activities.logs.job_logs import LogPolicy
from workers.settings import Settings
from workflows.domain.errors import FailureKind, ReboundError

__all__ = ["build_log_policy"]

MISSING_ROOTS = (
    "watch.log_roots is not set: a job names the files the worker reads (its comment's logs=, heartbeat=, ckpt=, "
    "its --output), so without roots it could make Rebound read any file on this host. Set watch.log_roots "
    '(REBOUND_WATCH__LOG_ROOTS=\'["/scratch", "/home"]\', or [watch] log_roots in the REBOUND_CONFIG file) to the '
    "directories where jobs write their logs and checkpoints"
)


def build_log_policy(settings: Settings) -> LogPolicy:
    """The worker's log policy (``watch.log_roots``, ``watch.log_require_owner``, ``logs.*``).

    Raises:
        ReboundError: ``CONFIGURATION`` when ``watch.log_roots`` is empty (the worker refuses to start).
    """
    if not settings.watch.log_roots:
        raise ReboundError(FailureKind.CONFIGURATION, MISSING_ROOTS)
    return LogPolicy(
        settings.watch.log_roots,
        require_owner=settings.watch.log_require_owner,
        glob_entries=settings.logs.glob_max_entries,
        max_files=settings.logs.max_files,
    )
