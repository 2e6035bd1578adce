"""Heartbeat files: files a rank touches while it is alive; their mtimes are progress without a log line.

A job names them in its opt-in comment (``heartbeat=/runs/x/ranks/rank-%t.hb``). Files are found and named by the
log tailer's own pattern machinery (``LogTail.identities``: ``%t``, or a ``rank-N`` in the file name; the same
access policy and glob budget as the logs). A file that names no rank is ignored: the time of "some rank" cannot
tell a hang from a straggler. Only ``stat`` is used: the files are never read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime

from activities.logs.access import LogAccess
from activities.logs.patterns import expand_patterns
from activities.logs.tail import LogTail
from workflows.domain.bounds import DEFAULT_GLOB_ENTRIES, MAX_FILES
from workflows.domain.slurm import SlurmJob

__all__ = ["heartbeat_times"]


def heartbeat_times(
    patterns: Iterable[str],
    job_id: int,
    access: LogAccess | None = None,
    job: SlurmJob | None = None,
    *,
    glob_entries: int = DEFAULT_GLOB_ENTRIES,
    max_files: int = MAX_FILES,
    overran: dict[str, str] | None = None,
) -> dict[int, datetime]:
    """The newest mtime of each rank's heartbeat file(s); ranks with no readable file are absent.

    Args:
        patterns: Absolute glob patterns with the job's placeholders (``expand_patterns``: ``%j``, an array task's
            ``%A``/``%a``, so a sibling's heartbeat never counts); ``%t`` is the rank; others match anything.
        job_id: The Slurm job id.
        access: Which files may be looked at (the job's log policy).
        job: The job as the scheduler lists it (array ids, name, user); None fills in ``%j`` only.
        glob_entries: ``logs.glob_max_entries``; max_files: ``logs.max_files``.
        overran: Patterns whose walk ran out of entries (kept by the caller across polls: never walked again).
    """
    times: dict[int, datetime] = {}
    for path, (rank, _node, _local) in (
        LogTail(
            expand_patterns(patterns, job_id, job),
            access=access,
            glob_entries=glob_entries,
            max_files=max_files,
            overran=overran,
        )
        .identities()
        .items()
    ):
        if rank is None:
            continue
        try:
            at = datetime.fromtimestamp(os.stat(path).st_mtime, UTC)
        except OSError:
            continue  # deleted between listing and stat, or unreadable: no sign of life
        if rank not in times or at > times[rank]:
            times[rank] = at
    return times
