"""The detection vocabulary every layer shares: what a log line can say (finding kinds) and the fixed causes an
attribution names. Compared as these enums everywhere; their string values are what travels and what is shown."""

from __future__ import annotations

from enum import StrEnum


class FindingKind(StrEnum):
    """What a log finding reports (the signature table's ``kind``); attribution keys on these values."""

    CUDA_ERROR = "cuda_error"
    XID = "xid"
    SEGFAULT = "segfault"
    FATAL_SIGNAL = "fatal_signal"
    """SIGABRT, SIGFPE, SIGILL: the process died of a signal it raised itself."""
    RANK_EXIT = "rank_exit"
    KILLED = "killed"
    COMM_ERROR = "comm_error"
    NODE_FAILURE = "node_failure"
    PYTHON_EXCEPTION = "python_exception"
    CHECKPOINT_LOAD = "checkpoint_load"
    """The job could not read the checkpoint it resumes from (a truncated ``torch.save`` zip, a safetensors file with a
    bad header, a DCP directory without ``.metadata``, a missing shard): the checkpoint, not the code or the node."""
    TERMINATED = "terminated"
    """srun (or Slurm) sent SIGTERM: the task was stopped, it did not fail."""
    REQUEUE = "requeue"
    CANCELLED = "cancelled"


class Cause(StrEnum):
    """The causes the attribution rules name (``Attribution.cause``).

    GPU faults name their own cause from the event (``xid-79``, ``gpu-lost``, ``ecc-dbe``), so ``Attribution.cause``
    stays a string; every other cause is one of these.
    """

    NODE_DOWN = "node-down"
    NODE_FAILURE = "node-failure"
    CUDA_ERROR = "cuda-error"
    USER_BUG = "user-bug"
    CHECKPOINT_UNREADABLE = "checkpoint-unreadable"
    """The checkpoint the job resumes from cannot be read: a restart loads it again unless the job is pointed at an
    older complete one (the recovery policy decides that)."""
    SEGFAULT = "segfault"
    RANK_KILLED = "rank-killed"
    FATAL_SIGNAL = "fatal-signal"
    RANK_CRASH = "rank-crash"
    RANKS_VANISHED = "ranks-vanished"
    """Only silence points at the node (peers lost their connections to it): weak until the scheduler confirms."""
    HANG = "hang"
    HANG_IN_KERNEL = "hang-in-kernel"
    STRAGGLER = "straggler"
    STRAGGLER_GPU_THROTTLED = "straggler-gpu-throttled"
    UNKNOWN = "unknown"
