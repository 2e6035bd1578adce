"""Liveness of a job that prints no step line: what successive samples of its ranks (node agents' stacks and CPU
times) and of its checkpoint directory showed. Frozen and bounded; carried by the sampler between samples. The
rules that fold samples in and judge them are ``workflows.policy.stacks`` (``note_liveness``, ``stack_motion``)
and ``workflows.policy.hang`` (``assess_silent_hang``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from workflows.domain.base import Frozen

__all__ = ["MAX_CHECKPOINT_TIMES", "MAX_LIVENESS_RANKS", "LivenessState", "RankLiveness", "StackMotion"]

#: Ranks tracked (a bound on the state, whatever the agents report).
MAX_LIVENESS_RANKS = 256
#: Completion times of the job's checkpoints remembered, newest last: enough to learn its cadence.
MAX_CHECKPOINT_TIMES = 16


class RankLiveness(Frozen):
    """One rank at the latest sample."""

    rank: int = Field(ge=0)
    node: str = ""
    signature: str = Field("", max_length=64)
    """A digest of its main thread's normalised stack (``stack_signature``); empty when no stack was read."""
    top: str = Field("", max_length=200)
    """Its innermost frame, normalised, for the timeline."""
    in_collective: bool = False
    """Its stack is inside a collective (all-reduce, barrier, ... or the autograd engine that runs DDP's)."""
    unchanged_since: datetime | None = None
    """The first sample that showed ``signature`` (None without a stack)."""
    cpu_time_s: float | None = None
    cpu_unchanged_since: datetime | None = None
    """The first sample that showed ``cpu_time_s`` (None when never read)."""


class LivenessState(Frozen):
    samples: int = Field(0, ge=0)
    first_sample_at: datetime | None = None
    last_sample_at: datetime | None = None
    ranks: tuple[RankLiveness, ...] = ()
    """Sorted by rank."""
    checkpoint_times: tuple[datetime, ...] = ()
    """Completion times of the distinct valid checkpoints seen, oldest first (bounded)."""
    last_checkpoint: str = ""
    """The path of the newest valid checkpoint seen."""
    restart_count: int = 0
    """The job's attempt these samples are of: a restarted job's ranks are sampled afresh."""
    window_note: str = ""
    """The hang window last said in the timeline (said again only when it changes)."""


class StackMotion(StrEnum):
    """What the ranks' stacks did between samples."""

    UNKNOWN = "unknown"
    """Fewer than two samples with stacks, or a rank without a stack: nothing to compare."""
    ADVANCING = "advancing"
    """Some rank's stack changed since the previous sample: the job runs."""
    PARKED = "parked"
    """Every rank's stack unchanged, a strict majority (or all ranks but one) inside a collective: waiting for a
    peer, if it lasts."""
    STILL = "still"
    """Unchanged, without a majority in a collective (a long kernel, I/O, evaluation): no verdict from stacks."""
