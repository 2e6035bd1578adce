"""A hung job's rank processes and their Python stacks, as a node agent sees them: evidence taken before a kill.

The node agent reads ``/proc`` for the processes of one job (``node_rank_processes``) and dumps every rank's
Python stack with py-spy (``node_dump_stacks``). Both are facts about one node; a workflow asks every node of the
job and stores the results with the incident. Texts are bounded here, so a payload never outgrows Temporal's
limits however deep a stack or long a command line is.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.ranks import StepLayout

__all__ = [
    "MAX_CMDLINE_CHARS",
    "MAX_MAIN_FRAMES",
    "PROC_STATE_MEANINGS",
    "NodeProcessesInput",
    "NodeProcessesResult",
    "RankProcess",
    "RankStack",
    "StackDumpInput",
    "StackDumpResult",
    "state_meaning",
]

MAX_CMDLINE_CHARS = 1024
"""A rank's command line is cut to this many characters (launchers pass very long argument lists)."""
MAX_MAIN_FRAMES = 128
"""Innermost frames kept of a main thread's stack: deep recursion must not blow up the payload."""

#: ``/proc/<pid>/stat`` state letters (proc(5)); ``t`` and ``T`` are distinct since Linux 2.6.33.
PROC_STATE_MEANINGS: dict[str, str] = {
    "R": "running",
    "S": "sleeping (interruptible wait)",
    "D": "uninterruptible wait (usually I/O or a driver)",
    "Z": "zombie (exited, not reaped)",
    "T": "stopped by a signal",
    "t": "stopped by a tracer",
    "X": "dead",
    "x": "dead",
    "I": "idle kernel thread",
    "K": "wakekill",
    "W": "waking / paging",
    "P": "parked",
}


def state_meaning(letter: str) -> str:
    """What a ``/proc`` state letter means, or ``unknown state 'Q'`` for a letter this table lacks."""
    return PROC_STATE_MEANINGS.get(letter, f"unknown state {letter!r}")


class RankProcess(Frozen):
    """One rank of a job as ``/proc`` shows it on one node, at ``NodeProcessesResult.observed_at``."""

    pid: int
    rank: int
    """Global rank: ``RANK`` (torchrun workers) when set, else ``SLURM_PROCID`` (srun tasks)."""
    job_id: int
    node: str
    state: str
    """The ``/proc/<pid>/stat`` state letter: R, S, D, Z, T, t, ..."""
    state_meaning: str = ""
    ppid: int = 0
    local_rank: int | None = None
    """``LOCAL_RANK`` when set, else ``SLURM_LOCALID``; None when neither is."""
    rank_source: str = ""
    """The environment variable the rank came from: ``RANK`` or ``SLURM_PROCID``."""
    step_id: str = ""
    """``SLURM_STEP_ID`` as Slurm sets it (``0``, ``1``, ...); empty when unset."""
    comm: str = ""
    """The kernel's short name of the process (PyTorch renames its main thread ``pt_main_thread``)."""
    cpu_time_s: float = 0.0
    """User plus system CPU time so far; two reads a while apart tell a spinning rank from a blocked one."""
    threads: int = 0
    wchan: str = ""
    """Kernel function the main thread waits in (``hrtimer_nanosleep``, ``futex_wait_queue``); empty if hidden."""
    rss_bytes: int = 0
    started_at: datetime | None = None
    cmdline: str = Field("", max_length=MAX_CMDLINE_CHARS)
    """Arguments joined by spaces, cut to ``MAX_CMDLINE_CHARS``."""
    task: int | None = None
    """``SLURM_PROCID``: the Slurm task (the rank under srun per rank; the node's launcher task under torchrun)."""
    local_world_size: int | None = None
    """``LOCAL_WORLD_SIZE`` set by a per-node launcher (torchrun, accelerate, DeepSpeed): its node's rank count."""
    world_size: int | None = None
    """``WORLD_SIZE`` set by a launcher, else the srun step's task count; None when neither is set."""


class NodeProcessesInput(Frozen):
    """Input of ``node_rank_processes``: which job's ranks to list on this node."""

    job_id: int = Field(gt=0)


class NodeProcessesResult(Frozen):
    """The job's rank processes on one node, one per rank, sorted by rank.

    An empty ``processes`` with ``unreadable > 0`` means the agent may lack the rights to see the ranks
    (it reads other users' ``/proc/<pid>/environ`` only as root or as their owner).
    """

    node: str
    observed_at: datetime
    processes: tuple[RankProcess, ...] = ()
    error: str = ""
    """Set when ``/proc`` itself could not be listed; ``processes`` is then empty."""
    unreadable: int = 0
    """Processes whose environment could not be read (permission denied), so whose job is unknown."""
    notes: tuple[str, ...] = ()
    """Why a candidate process was passed over (malformed stat, a second process claiming a rank, ...)."""
    step_layout: StepLayout | None = None
    """The layout srun gave the ranks' step (``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE``,
    ``SLURM_DISTRIBUTION``) when the ranks are srun tasks and it could be read; None otherwise."""


class StackDumpInput(Frozen):
    """Input of ``node_dump_stacks``: dump every rank of ``job_id`` on this node."""

    job_id: int = Field(gt=0)
    timeout_s: float = Field(10.0, gt=0, le=300)
    """Limit for one py-spy run (a rank whose pausing read times out gets one non-pausing try more)."""
    max_chars_per_rank: int = Field(8000, ge=256, le=1_000_000)
    native: bool = False
    """Also collect native (C/C++/CUDA) frames: slower, needs debug symbols to be useful."""


class RankStack(Frozen):
    """One rank's stack dump; ``error`` says why there is none (or why it is partial)."""

    rank: int
    pid: int
    node: str
    text: str = ""
    """py-spy's dump rendered as text, main thread first, cut to ``max_chars_per_rank``."""
    main_frames: tuple[str, ...] = ()
    """The main thread's frames as ``function (file:line)``, innermost first, at most ``MAX_MAIN_FRAMES``."""
    error: str = ""
    nonblocking: bool = False
    """Read without pausing the process (it was stopped, in D state, or the pausing read failed): frames may be
    torn if the rank was running."""
    elapsed_s: float = 0.0


class StackDumpResult(Frozen):
    """Every rank's stack on one node."""

    node: str
    stacks: tuple[RankStack, ...] = ()
    tool: str = ""
    """The dumper and its version, e.g. ``py-spy 0.4.3``; empty when it could not be run."""
    error: str = ""
    """Set when no rank could be dumped for a node-wide reason (py-spy missing, ``/proc`` unreadable)."""
    elapsed_s: float = 0.0
