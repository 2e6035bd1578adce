"""Comparing the ranks' stacks of a hung job: which ranks are not where the others are. Pure.

In a hung SPMD job the healthy ranks usually wait in the same collective (``all_reduce``, ``barrier``, a
``wait``), while the rank that caused the hang is elsewhere: sleeping, spinning in its own code, stuck in I/O.
So the evidence is the *shape* of each rank's main-thread stack, compared across ranks:

* ``stack_signature`` normalises frames so that what legitimately differs between ranks does not count: line
  numbers, memory addresses, thread ids and directories (each node may install the code in another place).
  Function names and file base names remain.
* ``odd_ranks`` returns the ranks whose signature differs from a strict majority's. Without a strict majority
  (two ranks that disagree, three shapes among four ranks) nobody is odd: picking a culprit would be a guess.
  Ranks without a stack (dump failed) are neither counted nor odd; ``describe_stacks`` lists them.
* ``describe_stacks`` is a short summary for an incident: groups of ranks with the same top frames.

For a job that prints no step line, successive samples tell a live job from a hung one (``note_liveness``,
``stack_motion``): a stack that changes between samples is a running rank; every rank inside a collective
(``in_collective``), unchanged sample after sample, is a job waiting for a peer. CPU time does not decide when
stacks are there: NCCL's proxy threads busy-poll during a hang, so a hung rank's CPU time still advances.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime

from workflows.domain.liveness import MAX_CHECKPOINT_TIMES, MAX_LIVENESS_RANKS, LivenessState, RankLiveness, StackMotion
from workflows.domain.procs import RankProcess, RankStack

__all__ = [
    "describe_stacks",
    "in_collective",
    "normalise_frame",
    "note_liveness",
    "odd_ranks",
    "rank_ranges",
    "stack_motion",
    "stack_signature",
]

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_THREAD_ID = re.compile(r"\b(thread|tid)([ _=:#-]*)\d+", re.IGNORECASE)
_LOCATION = re.compile(r"\s*\((?P<where>[^()]*)\)$")
_LINE_SUFFIX = re.compile(r":\d+$")
_TRACEBACK = re.compile(r'^File "(?P<file>[^"]*)", line \d+, in (?P<func>.+)$')
_SPACES = re.compile(r"\s+")
_SEPARATOR = " <- "
_MAX_GROUP_LINES = 8
_MAX_ERROR_LINES = 5
#: Normalised frames (``function (file)``) of a rank waiting in a collective: torch.distributed's Python API (and
#: the c10d logger's wrapper around it), a work handle's ``wait``, the native NCCL/Gloo frames of a ``--native``
#: dump, and the autograd engine, where DDP and FSDP run their gradient all-reduce from hooks (a Python stack of a
#: DDP hang shows ``backward``, not ``all_reduce``).
_COLLECTIVE = re.compile(
    r"^(?:all_reduce\w*|allreduce\w*|all_gather\w*|reduce_scatter\w*|broadcast\w*|(?:monitored_)?barrier|all_to_all\w*"
    r"|reduce|gather|scatter|send|recv|wait|wrapper) \((?:distributed_c10d|c10d_logger)\.py\)"
    r"|nccl|ProcessGroupNCCL|ProcessGroupGloo|gloo::"
    r"|^_?engine_run_backward \(graph\.py\)|^backward \((?:__init__|_tensor)\.py\)|^run_backward\b",
)
#: How many innermost frames are looked at for a collective (wrappers sit between it and the innermost frame).
_COLLECTIVE_DEPTH = 8


def normalise_frame(frame: str) -> str:
    """One frame without what differs between identical ranks: ``f (/a/b/x.py:12)`` -> ``f (x.py)``.

    Also accepts a traceback line (``File "/a/x.py", line 12, in f``) and native frames with addresses.
    """
    text = _SPACES.sub(" ", frame.strip())
    traceback = _TRACEBACK.match(text)
    if traceback:
        text = f"{traceback['func']} ({traceback['file']})"
    location = _LOCATION.search(text)
    if location:
        where = _LINE_SUFFIX.sub("", location["where"].strip())
        text = f"{text[: location.start()]} ({os.path.basename(where) or where})"
    text = _ADDRESS.sub("0x?", text)
    return _THREAD_ID.sub(lambda m: f"{m[1]}{m[2]}?", text)


def stack_signature(frames: Sequence[str]) -> str:
    """The normalised frames, innermost first, as one comparable string; ``""`` for no frames."""
    return _SEPARATOR.join(normalise_frame(f) for f in frames)


def _with_stacks(stacks: Iterable[RankStack]) -> dict[int, str]:
    """Rank -> signature for ranks that have frames; the first stack of a rank counts."""
    signatures: dict[int, str] = {}
    for s in stacks:
        if s.main_frames and s.rank not in signatures:
            signatures[s.rank] = stack_signature(s.main_frames)
    return signatures


def _majority(signatures: dict[int, str]) -> str | None:
    counts: dict[str, int] = {}
    for sig in signatures.values():
        counts[sig] = counts.get(sig, 0) + 1
    if not counts:
        return None
    best, n = max(counts.items(), key=lambda kv: kv[1])
    return best if 2 * n > len(signatures) else None


def odd_ranks(stacks: Iterable[RankStack]) -> list[int]:
    """Ranks whose stack differs from the strict majority's, sorted; ``[]`` when all agree or none is a majority."""
    signatures = _with_stacks(stacks)
    majority = _majority(signatures)
    if majority is None:
        return []
    return sorted(rank for rank, sig in signatures.items() if sig != majority)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _ranks_label(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


def describe_stacks(stacks: Iterable[RankStack], top: int = 3) -> str:
    """A few lines for humans: ranks grouped by their ``top`` innermost frames, odd ranks marked, failures listed.

    Ranks in one group may still differ further out; the mark then names the odd ones (``[odd: 3]``).

    Example::

        3 ranks with stacks, 2 shapes; odd: rank 1
        ranks 0,2: wait (threading.py) <- all_reduce_wait (rank.py) <- main (rank.py)
        rank 1 [odd]: load_next_batch (rank.py) <- main (rank.py) <- <module> (rank.py)
    """
    stacks = list(stacks)
    signatures = _with_stacks(stacks)
    odd = set(odd_ranks(stacks))
    groups: dict[str, list[int]] = {}
    seen: set[int] = set()
    for s in stacks:
        if s.rank in signatures and s.rank not in seen:
            seen.add(s.rank)
            head = _SEPARATOR.join(normalise_frame(f) for f in s.main_frames[:top])
            if len(s.main_frames) > top:
                head += _SEPARATOR + "..."
            groups.setdefault(head, []).append(s.rank)
    shapes = len(set(signatures.values()))
    summary = f"{len(signatures)} ranks with stacks, {shapes} shape{'s' if shapes != 1 else ''}"
    if odd:
        summary += f"; odd: {_ranks_label(sorted(odd))}"
    elif shapes > 1:
        summary += "; no majority shape"
    lines = [summary]
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    for head, ranks in ordered[:_MAX_GROUP_LINES]:
        odd_here = sorted(odd.intersection(ranks))
        if not odd_here:
            mark = ""
        elif len(odd_here) == len(ranks):
            mark = " [odd]"
        else:  # same top frames, different further out
            mark = f" [odd: {rank_ranges(odd_here)}]"
        lines.append(f"{_ranks_label(sorted(ranks))}{mark}: {head}")
    if len(ordered) > _MAX_GROUP_LINES:
        lines.append(f"... {len(ordered) - _MAX_GROUP_LINES} more groups")
    failed = sorted({(s.rank, s.error or "no frames") for s in stacks if s.rank not in signatures})
    for rank, error in failed[:_MAX_ERROR_LINES]:
        lines.append(f"rank {rank}: no stack ({error[:100]})")
    if len(failed) > _MAX_ERROR_LINES:
        lines.append(f"... {len(failed) - _MAX_ERROR_LINES} more ranks without a stack")
    return "\n".join(lines)


def in_collective(frames: Sequence[str]) -> bool:
    """Whether a stack (innermost first) waits inside a collective (see ``_COLLECTIVE``)."""
    return any(_COLLECTIVE.search(normalise_frame(f)) for f in frames[:_COLLECTIVE_DEPTH])


def note_liveness(
    state: LivenessState,
    at: datetime,
    stacks: Iterable[RankStack],
    processes: Iterable[RankProcess] = (),
    checkpoint: tuple[str, datetime | None] | None = None,
) -> LivenessState:
    """``state`` with one sample folded in: the ranks' stacks and CPU times at ``at``, and the newest valid
    checkpoint (path, completion time) of the job's directory. Ranks absent from this sample keep what they had.
    """
    by_rank = {r.rank: r for r in state.ranks}
    signatures = {s.rank: s for s in stacks if s.main_frames}
    cpu = {p.rank: p for p in processes}
    for rank in sorted(set(signatures) | set(cpu)):
        old = by_rank.get(rank)
        if old is None and len(by_rank) >= MAX_LIVENESS_RANKS:
            continue
        old = old or RankLiveness(rank=rank)
        update: dict[str, object] = {}
        stack = signatures.get(rank)
        if stack is not None:
            # A digest: the state travels in workflow history, and only equality matters.
            sig = hashlib.sha256(stack_signature(stack.main_frames).encode()).hexdigest()[:32]
            update.update(
                signature=sig,
                top=normalise_frame(stack.main_frames[0])[:200],
                in_collective=in_collective(stack.main_frames),
                node=stack.node or old.node,
                unchanged_since=old.unchanged_since if sig == old.signature else at,
            )
        proc = cpu.get(rank)
        if proc is not None:
            same = old.cpu_time_s is not None and proc.cpu_time_s <= old.cpu_time_s
            update.update(
                cpu_time_s=proc.cpu_time_s,
                cpu_unchanged_since=old.cpu_unchanged_since if same else at,
                node=old.node or proc.node,
            )
        by_rank[rank] = old.model_copy(update=update)
    times = state.checkpoint_times
    path = state.last_checkpoint
    # A new save is a new path, or the same path completed again (Lightning rewrites ``last.ckpt``).
    if checkpoint is not None and (checkpoint[0] != path or (checkpoint[1] is not None and checkpoint[1] not in times)):
        path = checkpoint[0]
        if checkpoint[1] is not None and checkpoint[1] not in times:
            times = (*times, checkpoint[1])[-MAX_CHECKPOINT_TIMES:]
    return state.model_copy(
        update={
            "samples": state.samples + 1,
            "first_sample_at": state.first_sample_at or at,
            "last_sample_at": at,
            "ranks": tuple(by_rank[k] for k in sorted(by_rank)),
            "checkpoint_times": times,
            "last_checkpoint": path,
        }
    )


def stack_motion(state: LivenessState, expected_ranks: int = 0) -> tuple[StackMotion, datetime | None]:
    """What the stacks did, and since when they have not moved (``PARKED``/``STILL``; None otherwise).

    ``expected_ranks``: how many ranks the job has (0: unknown); a rank never sampled leaves the motion unknown.
    """
    stacked = [r for r in state.ranks if r.signature and r.unchanged_since is not None]
    if state.samples < 2 or not stacked or len(stacked) < expected_ranks:
        return StackMotion.UNKNOWN, None
    if any(r.unchanged_since == state.last_sample_at for r in stacked):
        return StackMotion.ADVANCING, None
    since = max(r.unchanged_since for r in stacked if r.unchanged_since is not None)
    # Peers wait in the collective for the rank that never arrives: a strict majority in one is enough, or every
    # rank but one (two ranks: the peer waits, the stuck one is in its own code); the others, stuck in their own
    # code, are the odd ranks the incident names.
    waiting = sum(r.in_collective for r in stacked)
    if 2 * waiting > len(stacked) or (waiting >= 1 and waiting == len(stacked) - 1):
        return StackMotion.PARKED, since
    return StackMotion.STILL, since
