"""Per-job bounds: every limit on what one job can make Rebound read, track or keep, in one place.

A job chooses its log patterns, how many files it writes, how many ranks its lines claim and how fast it writes;
none of that may grow the worker's memory, its CPU per poll, or what travels through Temporal (heartbeat details
and payloads over 2 MB are refused) without a bound. Each limit below is enforced where it applies (the module
named beside it) and says so when it is hit: refused files and patterns in the worker's log and ``LogTail.refused``,
ranks past the tracking cap in the job's timeline (``RANKS_NOTE``) and in its hang verdicts. The table in
``docs/detection.md`` ("Per-job bounds") lists them with what happens beyond each.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_GLOB_ENTRIES",
    "DEFAULT_MAX_BYTES_PER_CALL",
    "DEFAULT_MAX_BYTES_PER_FILE",
    "DEFAULT_MAX_LINES_PER_CALL",
    "MAX_FILES",
    "MAX_GLOB_ENTRIES",
    "MAX_TRACKED_RANKS",
    "PROGRESS_RING",
    "PROGRESS_STATE_MAX_BYTES",
    "HISTORY_MAX_BYTES",
    "HISTORY_MAX_EVENTS",
    "RANKS_NOTE",
    "history_full",
]

# ----- reading a job's logs (activities/logs/tail.py, globbing.py) ---------------------------------------------
MAX_GLOB_ENTRIES = 100_000
"""Directory entries one expansion of a job's patterns may look at, at most, whatever the operator sets (each
listing counts as one more): glob breadth."""
DEFAULT_GLOB_ENTRIES = 10_000
"""The default of that budget (``logs.glob_max_entries``). A pattern that reaches it is refused until the job's next
attempt (``LogTail``), so a ``logs=/scratch/**`` costs one walk of this many entries, not one every glob
(``GLOB_EVERY_S``): 100,000 entries every 2 s was ~50,000 directory entries a second for one hostile job."""
MAX_FILES = 10_000
"""Files one job's patterns may match and be read; the offsets of more would not fit a Temporal heartbeat."""
DEFAULT_MAX_BYTES_PER_FILE = 1 << 20
"""New bytes read from each file per poll; the rest waits for the next poll (nothing is dropped)."""
# What one poll may cost, measured with tracemalloc in tests/property/test_tail_bounds.py: the bytes (read, then
# decoded) and about 1.4 KB per LogLine; together well under 32 MiB whatever the files hold. At a poll a second
# that drains 4 MiB/s or 10k lines/s of backlog; what does not fit waits, nothing is dropped.
DEFAULT_MAX_BYTES_PER_CALL = 4 << 20
"""New bytes read from all of a job's files per poll."""
DEFAULT_MAX_LINES_PER_CALL = 10_000
"""Lines returned per poll; the rest wait, in order."""

# ----- tracking a job's progress (workflows/domain/progress.py) ---------------------------------------------------
MAX_TRACKED_RANKS = 128
"""Ranks whose progress is tracked one by one (last step, gaps, step and compute times: what the hang culprit and
the straggler policy read). The step lines of ranks beyond are summarised (``UntrackedRanks``: they still count as
progress, so a job is never called hung while they step) and the timeline says so once."""
PROGRESS_RING = 64
"""Recent gaps and step/compute times each tracked rank keeps: 64 is ~13 s of 0.2 s steps, enough for a p99 once
pooled across ranks; about 1.6 KB of JSON per rank."""
PROGRESS_STATE_MAX_BYTES = 256 * 1024
"""What one job's progress state may weigh as JSON (it travels in heartbeat details and across continue-as-new),
whatever its rank count: ``MAX_TRACKED_RANKS`` x ~1.6 KB plus the summary
(``tests/unit/domain/test_progress_bounds.py``)."""

RANKS_NOTE = (
    "tracking {tracked} of at least {seen} ranks one by one (the cap is {cap}): the others' step lines are "
    "summarised and count as progress (a job is not called hung while they step), but their own silence, "
    "stragglers and hang culprits are not assessed"
)
"""The timeline's note when a job's lines name more ranks than ``MAX_TRACKED_RANKS``."""

# ----- workflow histories (workflows/history.py) -------------------------------------------------------------------
HISTORY_MAX_EVENTS = 5_000
"""JobRecovery, Fleet and ClusterWatch continue as new once their history has this many events, whether or not the
server suggested it: servers before 1.20 never suggest, and one discovery round or a long incident can add
thousands of events between two looks. Temporal warns at 10,240 events and ends a workflow at 51,200."""
HISTORY_MAX_BYTES = 5 * 1024 * 1024
"""The same for the history's size (Temporal warns at 10 MB and ends a workflow at 50 MB)."""


def history_full(events: int, size_bytes: int) -> bool:
    """True when a history this long or this large should continue as new (``HISTORY_MAX_*``)."""
    return events >= HISTORY_MAX_EVENTS or size_bytes >= HISTORY_MAX_BYTES
