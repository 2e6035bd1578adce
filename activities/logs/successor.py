"""Which lines the resume check reads are the restarted job's new attempt's, and which are its old attempt's.

A job that appends every attempt to one file (Slurm's ``slurm-%j.out`` with ``--open-mode=append``, a ``>>``
redirect) holds the old attempt's last words after the offsets the resume check starts from: slurmstepd's
``*** JOB 12 ON n1 CANCELLED AT ... DUE TO JOB REQUEUE ***``, torch elastic's ``SignalException ... got signal:
15`` traceback, srun's ``task 0: Exited with exit code 1``. Most of them carry no leading timestamp, so the time of
a line cannot say whose it is; its place in the file can. Slurm starts a requeued job again only once its previous
attempt is over (the job is no longer COMPLETING: every process of that attempt is gone), so in such a file every
byte of the old attempt comes before every byte of the new one. The boundary is found from two facts:

* the files' sizes the first time the resume check sees the previous attempt over (``previous_attempt_over``):
  every byte of the old attempt lies below them (``WatchActivities.wait_resume`` records them with
  ``LogTail.anchor``, so a file the new attempt created is the new attempt's from byte 0);
* a line below that size stamped at or after the restart (``WaitResumeInput.not_before``) is the new attempt's,
  and so is every line after it in that file: the boundary moves down to it.

A file read again from 0 (truncated or replaced: Slurm's default ``slurm-%j.out`` is truncated when the job
starts again) was rewritten after the old attempt: all of it is the new attempt's. Before the previous attempt is
seen over, no unstamped line can be placed: only stamped lines are kept (``decide_resume`` judges their times).

Why it matters (lab, issue 11): the worker was slow between releasing the requeued job and its resume check's
first read; by then the new attempt ran, and the old torchrun agent's ``SignalException`` traceback, read for the
first time, was taken as the new attempt's crash: "failed again before resuming", then a user bug, given up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from activities.logs.line import LogLine
from workflows.domain.slurm import JobState, SlurmJob

__all__ = ["previous_attempt_over", "successor_lines"]


def previous_attempt_over(job: SlurmJob | None, expected_restart_count: int) -> bool:
    """Whether Slurm shows the attempt before the restart being verified over: the job counts the restart and is
    not COMPLETING (Slurm counts a requeue while the old attempt is still being torn down, and starts the job again
    only after that)."""
    return job is not None and job.restart_count >= expected_restart_count and job.state is not JobState.COMPLETING


def successor_lines(
    lines: Sequence[LogLine],
    *,
    read_from: Mapping[str, int],
    boundary: Mapping[str, int] | None,
    since: datetime | None,
) -> tuple[list[LogLine], dict[str, int] | None]:
    """The lines of one read that may be the new attempt's, and the boundary moved by what they show.

    Args:
        lines: One ``LogTail.read_new`` call's lines, by path then offset.
        read_from: The positions that read started from (``activities.logs.tail.positions``): a line below its
            file's position means the file was read again from 0.
        boundary: Per file, where the old attempt's output ends (module docstring); a file it does not name is
            the new attempt's from byte 0. None: the previous attempt has not been seen over yet.
        since: When the restart was verified: a line stamped at or after it is the new attempt's.

    Returns:
        The lines kept (every stamped line, whose time ``decide_resume`` judges, and every unstamped line at or
        past its file's boundary), and the boundary to use next (None while it is not known).
    """
    moved = dict(boundary) if boundary is not None else None
    kept: list[LogLine] = []
    for line in lines:
        if moved is not None and line.offset < read_from.get(line.path, 0):
            moved[line.path] = 0  # read again from 0: rewritten since the old attempt ended
        if line.at is not None:
            kept.append(line)
            if moved is not None and since is not None and line.at >= since:
                moved[line.path] = min(moved.get(line.path, 0), line.offset)
        elif moved is not None and line.offset >= moved.get(line.path, 0):
            kept.append(line)
    return kept, moved
