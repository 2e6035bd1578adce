"""A job's log files as the worker may read them: which files to tail, and the access policy they are read under
(``watch.log_roots``, ``watch.log_require_owner``; the checks themselves are ``activities.logs.access``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.logs.access import LogAccess
from activities.logs.patterns import expand_patterns
from activities.logs.tail import LogTail
from workflows.domain.bounds import DEFAULT_GLOB_ENTRIES, MAX_FILES
from workflows.domain.slurm import SlurmJob

__all__ = ["LogPolicy", "log_patterns"]


def log_patterns(patterns: Sequence[str], job: SlurmJob | None, job_id: int) -> list[str]:
    """The files to tail: the spec's patterns with the job's own placeholders filled in (``%j``, and for an array
    task ``%A``/``%a``: ``expand_patterns``), else the job's own stdout/stderr as Slurm resolves them
    (``activities.slurm.parse``: ``slurm-%j.out``, or ``slurm-%A_%a.out`` for an array task, in its working
    directory, when the job gave no ``--output``)."""
    if patterns:
        return expand_patterns(patterns, job_id, job)
    if job is None:
        return []
    return sorted({p for p in (job.standard_output, job.standard_error) if p})


class LogPolicy:
    """Which log files of a job the worker may read (``watch.log_roots``, ``watch.log_require_owner``).

    A job's owner chooses the log patterns (in its comment), and the worker often runs as root: without this,
    a job could make Rebound read, and show as evidence, any file on the host.
    """

    def __init__(
        self,
        roots: Sequence[Path | str] = (),
        *,
        require_owner: bool = False,
        glob_entries: int = DEFAULT_GLOB_ENTRIES,
        max_files: int = MAX_FILES,
    ) -> None:
        """Bind the policy.

        Args:
            roots: ``watch.log_roots``; empty: no root restriction (the worker refuses to start so:
                ``workers.log_policy``).
            require_owner: ``watch.log_require_owner``.
            glob_entries: ``logs.glob_max_entries``, directory entries one expansion of a job's patterns may visit.
            max_files: ``logs.max_files``, files one job's patterns may match.
        """
        self._roots = tuple(roots)
        self._require_owner = require_owner
        self._glob_entries = glob_entries
        self._max_files = max_files
        self._reported: dict[int, dict[str, str]] = {}

    @property
    def glob_entries(self) -> int:
        """``logs.glob_max_entries``: directory entries one expansion of a job's patterns may visit."""
        return self._glob_entries

    @property
    def max_files(self) -> int:
        """``logs.max_files``: files one job's patterns may match."""
        return self._max_files

    def access(self, job: SlurmJob | None) -> LogAccess | None:
        """The job's access policy (every file refused when the job is unknown); None when nothing is restricted."""
        return self.access_for_user(job.user_id if job is not None else None)

    def access_for_user(self, user_id: int | None) -> LogAccess | None:
        """The policy for files a job of user ``user_id`` names (every file refused when the owner is required and
        the user is unknown); None when nothing is restricted. Also the rule for its checkpoint directory."""
        if not self._roots and not self._require_owner:
            return None
        return LogAccess.for_job(self._roots, user_id, require_owner=self._require_owner)

    def tail(self, patterns: Sequence[str], job: SlurmJob | None, job_id: int) -> LogTail:
        """A tail over the job's log files, bound to this policy and anchored to the job's current attempt.

        Offsets that are not anchored yet (the job is first seen) start at what the files hold now, and lines
        stamped before the attempt started never count (``activities.logs.tail``); the attempt started at the
        job's ``start_time``, or, for a job not running yet (or unknown), now: whatever exists is older.
        """
        start = job.start_time if job is not None and job.start_time is not None else None
        hosts = job.nodes if job is not None else ()
        return LogTail(
            patterns,
            access=self.access(job),
            attempt_start=start or datetime.now(UTC),
            hosts=hosts,
            glob_entries=self._glob_entries,
            max_files=self._max_files,
        )

    def report(self, job_id: int, tail: LogTail) -> None:
        """Log refused patterns and files once per job and change: an operator must see why evidence is missing."""
        refused = tail.refused
        if refused and refused != self._reported.get(job_id):
            activity.logger.warning("job %s: log files not read: %s", job_id, refused)
        self._reported[job_id] = refused
