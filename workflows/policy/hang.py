"""Hang: no rank of the job made progress for longer than the job's own rhythm allows. Pure and deterministic.

A job is hung only when NO rank progressed (a step line, or a heartbeat file's mtime) for the window; one rank
that is slow while others step is a straggler (``workflows.policy.straggler``), not a hang. In synchronous data
parallelism a stopped rank stops everyone at the next collective, so the silence is job-wide either way.

The window, first rule that applies:

1. ``override_s`` (the job's ``hang_after_s``) replaces what is learned below.
2. Learned, once ``min_intervals`` gaps between step lines are known: the largest of ``floor_s``, ``k`` times the
   p99 of the recent gaps (pooled across ranks), and ``longest_factor`` times the longest gap the job ever came
   back from (a checkpoint save or an evaluation rarer than the ring remembers must not read as a hang).
3. Startup: before that, or while the current attempt has not logged a step since ``note_restart``, at least
   ``startup_s`` (model load, first step, checkpoint load).

Silence is counted from the latest step line or activity of any rank, and never from before Rebound was watching
or before the current attempt started. Without any step line ever seen there is no verdict: a job whose log
format is not recognised must not be restarted for being quiet.

A job that prints no step line (``assess_silent_hang``) is judged on the node agents' samples of its ranks and on
its checkpoint directory. Its window: its own ``hang=``; else learned from its checkpoint cadence
(``cadence_factor`` x the longest interval between two saves, once ``cadence_min_intervals`` are known); else the
operator's ``silent_default_s``; the verdict says which. Hung when, for the window, no new checkpoint or heartbeat
came and the ranks' stacks stayed parked in a collective (``workflows.policy.stacks.stack_motion``). Stacks decide
over CPU time (NCCL's proxy threads busy-poll during a hang); only without any stack does CPU time flat on every
rank for the window count.

The likely culprit is the rank whose progress stopped first: lowest last step, then earliest last progress.
A rank that missed the last step its peers completed stopped inside it (high confidence); one whose last line is
earlier by more than half a typical gap is a weaker sign; otherwise the logs cannot tell the ranks apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime

from workflows.domain.hang import HangPolicy, HangVerdict, RankSilence, WindowBasis
from workflows.domain.liveness import LivenessState, StackMotion
from workflows.domain.progress import ProgressState, RankProgress, aware
from workflows.policy.stacks import stack_motion

__all__ = [
    "SAMPLES_PER_WINDOW",
    "assess_hang",
    "assess_silent_hang",
    "hang_window",
    "may_be_hung",
    "percentile",
    "silent_sample_interval",
    "silent_window",
]

#: A job without step lines is sampled this many times per hang window: parked stacks are first seen at most a
#: quarter window after the hang began, so the hang is called within about 1.25 windows (plus one sample).
SAMPLES_PER_WINDOW = 4

_CONFIDENCE_BEHIND = 0.8
_CONFIDENCE_EARLIER = 0.5
_CONFIDENCE_ALONE = 0.3
_CONFIDENCE_TIED = 0.1


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty. With few values, p99 is the max."""
    ordered = sorted(values)
    if not ordered:
        return None
    index = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[min(index, len(ordered) - 1)]


def hang_window(state: ProgressState, policy: HangPolicy) -> tuple[float, WindowBasis, str]:
    """The window that applies to ``state`` now, which rule set it, and a human-readable derivation."""
    gaps = [g for r in state.ranks for g in r.gaps_s]
    learned = len(gaps) >= policy.min_intervals
    if policy.override_s is not None:
        window, basis, detail = policy.override_s, WindowBasis.OVERRIDE, f"the job's own {policy.override_s:g} s"
    elif learned:
        p99 = percentile(gaps, 99) or 0.0
        options = [
            (policy.floor_s, WindowBasis.FLOOR),
            (policy.k * p99, WindowBasis.LEARNED),
            (policy.longest_factor * state.longest_gap_s, WindowBasis.LONGEST),
        ]
        window, basis = max(options, key=lambda o: o[0])
        detail = (
            f"max(floor {policy.floor_s:g} s, {policy.k:g} x p99 {p99:.3g} s of {len(gaps)} gaps, "
            f"{policy.longest_factor:g} x longest {state.longest_gap_s:.3g} s)"
        )
    else:
        window, basis, detail = 0.0, WindowBasis.STARTUP, f"{len(gaps)} of {policy.min_intervals} gaps learned"
    # The job's own window needs nothing learned; the startup window still covers loading after a (re)start.
    unlearned = policy.override_s is None and not learned
    if (unlearned or not _stepped_since_restart(state)) and policy.startup_s >= window:
        why = detail if unlearned else "no step since the start of this attempt"
        return policy.startup_s, WindowBasis.STARTUP, f"startup {policy.startup_s:g} s ({why})"
    return window, basis, detail


def may_be_hung(state: ProgressState, now: datetime, policy: HangPolicy) -> bool:
    """False when ``assess_hang`` cannot find the job hung at ``now``: the job's latest sign of life is more recent
    than any window could be (``hang_window`` is never below the override, else the floor or the startup window),
    or nothing was observed. Cheap: a watch asks it every poll and only then builds the verdict."""
    others = state.untracked
    marks = [t for r in state.ranks for t in (r.last_progress_at, r.last_activity_at) if t is not None]
    marks += [t for t in (state.watching_since, state.restarted_at) if t is not None]
    if others is not None and others.last_heard_at is not None:
        marks.append(others.last_heard_at)
    if not marks:
        return False
    least = policy.override_s if policy.override_s is not None else min(policy.floor_s, policy.startup_s)
    silent = _since(aware(now), max(marks)) or 0.0
    return silent > 0 and silent >= least


def assess_hang(
    state: ProgressState, now: datetime, policy: HangPolicy, expected_ranks: Iterable[int] = ()
) -> HangVerdict:
    """Whether the job is hung at ``now``, and if so who stopped first (see the module docstring).

    Args:
        state: Progress as of the latest poll.
        now: The watcher's clock.
        policy: The windows.
        expected_ranks: Ranks that should log steps (to report those never heard from); may be empty.

    Returns:
        The verdict, always with the window and how it was derived.
    """
    now = aware(now)
    window, basis, detail = hang_window(state, policy)
    seen = {r.rank for r in state.ranks}
    unseen = tuple(sorted({r for r in expected_ranks if r not in seen}))
    ranks = tuple(
        RankSilence(rank=r.rank, node=r.node, last_step=r.last_step, silent_for_s=_since(now, r.last_heard_at))
        for r in state.ranks
    )
    stalled = tuple(s.rank for s in ranks if s.silent_for_s is not None and s.silent_for_s >= window)
    common = {"window_s": window, "basis": basis, "window_detail": detail, "ranks": ranks, "unseen_ranks": unseen}
    others = state.untracked  # ranks past the tracking cap: their lines count as progress
    heard = state.ever_progressed or any(r.last_activity_at is not None for r in state.ranks)
    heard = heard or (others is not None and others.last_heard_at is not None)
    if policy.require_progress_seen and not heard:
        summary = "no verdict: no step line seen yet (the job may still be loading, or its log format is unknown)"
        return HangVerdict(hung=False, stalled_ranks=stalled, summary=summary, **common)
    marks = [t for r in state.ranks for t in (r.last_heard_at,) if t is not None]
    marks += [t for t in (state.watching_since, state.restarted_at) if t is not None]
    if others is not None and others.last_heard_at is not None:
        marks.append(others.last_heard_at)
    if not marks:
        return HangVerdict(hung=False, summary="no verdict: nothing observed yet", **common)
    silent = _since(now, max(marks)) or 0.0
    if silent < window or silent <= 0:
        last_steps = [r.last_step for r in state.ranks] + [others.last_step if others is not None else None]
        latest = max((s for s in last_steps if s is not None), default=None)
        summary = f"progressing: last step {latest}, quiet {silent:.1f} s of a {window:.1f} s window ({basis})"
        return HangVerdict(hung=False, silent_for_s=silent, stalled_ranks=stalled, summary=summary, **common)
    culprit, confidence, why = _culprit(state)
    summary = f"hung: no rank progressed for {silent:.1f} s (window {window:.1f} s, {basis}: {detail})"
    if stalled:
        steps = sorted({s.last_step for s in ranks if s.last_step is not None})
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
        summary += f"; {len(stalled)} rank(s) stalled at {at}"
    if culprit is not None:
        where = f" on {culprit.node}" if culprit.node else ""
        summary += f"; likely culprit rank {culprit.rank}{where} ({why}, confidence {confidence:.1f})"
    if state.ranks_note:
        summary += f"; {state.ranks_note}"
    return HangVerdict(
        hung=True,
        silent_for_s=silent,
        stalled_ranks=stalled,
        culprit_rank=culprit.rank if culprit else None,
        culprit_node=culprit.node if culprit else "",
        confidence=confidence if culprit else 0.0,
        summary=summary,
        **common,
    )


def _stepped_since_restart(state: ProgressState) -> bool:
    start = state.restarted_at
    stamps = [r.last_progress_at for r in state.ranks]
    stamps.append(state.untracked.last_progress_at if state.untracked is not None else None)
    return any(t is not None and (start is None or t >= start) for t in stamps)


def _since(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def _culprit(state: ProgressState) -> tuple[RankProgress | None, float, str]:
    """The rank that stopped first, how sure, and why (see the module docstring)."""
    stepped = [r for r in state.ranks if r.last_step is not None and r.last_progress_at is not None]
    if not stepped:
        return None, 0.0, ""

    def key(r: RankProgress) -> tuple[int, int, datetime]:
        assert r.last_step is not None and r.last_progress_at is not None
        return (r.last_epoch or 0, r.last_step, r.last_progress_at)

    ordered = sorted(stepped, key=key)
    first = ordered[0]
    if len(ordered) == 1:
        return first, _CONFIDENCE_ALONE, f"the only rank logging steps, stopped at step {first.last_step}"
    behind = [r for r in ordered if key(r)[:2] == key(first)[:2]]
    if len(behind) == 1:
        return first, _CONFIDENCE_BEHIND, f"stopped at step {first.last_step}, its peers reached {ordered[1].last_step}"
    gaps = sorted(g for r in stepped for g in r.gaps_s)
    margin = gaps[len(gaps) // 2] / 2 if gaps else 0.0
    lead = (key(behind[1])[2] - key(first)[2]).total_seconds()
    if lead > margin and lead > 0:
        return first, _CONFIDENCE_EARLIER, f"last step line {lead:.2f} s before any peer's at step {first.last_step}"
    if len(behind) < len(ordered):
        return first, _CONFIDENCE_ALONE, f"one of {len(behind)} ranks that stopped at step {first.last_step}"
    return first, _CONFIDENCE_TIED, f"all stopped at step {first.last_step} together: the logs cannot tell"


def silent_window(policy: HangPolicy, checkpoint_times: Sequence[datetime]) -> tuple[float, WindowBasis, str]:
    """The hang window of a job that prints no step line, which rule set it, and how (see the module docstring)."""
    if policy.override_s is not None:
        return policy.override_s, WindowBasis.OVERRIDE, f"the job's own hang= {policy.override_s:g} s"
    ordered = sorted(aware(t) for t in checkpoint_times)
    intervals = [(b - a).total_seconds() for a, b in zip(ordered, ordered[1:], strict=False) if b > a]
    if len(intervals) >= policy.cadence_min_intervals:
        longest = max(intervals)
        window = max(policy.floor_s, policy.cadence_factor * longest)
        detail = (
            f"learned from its checkpoint cadence: {policy.cadence_factor:g} x the longest of {len(intervals)} "
            f"intervals between saves ({longest:.0f} s)"
        )
        return window, WindowBasis.CHECKPOINT_CADENCE, detail
    detail = (
        f"the operator's default {policy.silent_default_s:g} s (no hang=, {len(intervals)} of "
        f"{policy.cadence_min_intervals} checkpoint intervals learned)"
    )
    return policy.silent_default_s, WindowBasis.DEFAULT, detail


def silent_sample_interval(
    policy: HangPolicy, checkpoint_times: Sequence[datetime], *, least_s: float, most_s: float
) -> tuple[float, str]:
    """How often to sample a job that prints no step line: ``SAMPLES_PER_WINDOW`` times per its hang window
    (``silent_window``: its ``hang=``, its checkpoint cadence, else the operator's default), never more often
    than every ``least_s`` (each sample asks every node agent for stacks) nor less often than every ``most_s``
    (the operator's ceiling wins when the two cross).

    Returns:
        The interval in seconds and how it was derived (for the timeline).
    """
    window, basis, _ = silent_window(policy, checkpoint_times)
    wanted = window / SAMPLES_PER_WINDOW
    interval = min(max(wanted, least_s), most_s)
    bound = "" if interval == wanted else f", bounded to [{least_s:g}, {most_s:g}] s"
    return interval, f"every {interval:.0f} s: 1/{SAMPLES_PER_WINDOW} of the {window:.0f} s window ({basis}){bound}"


def assess_silent_hang(
    liveness: LivenessState,
    now: datetime,
    policy: HangPolicy,
    *,
    last_sign_of_life: datetime | None = None,
    expected_ranks: int = 0,
) -> HangVerdict:
    """Whether a job that prints no step line is hung at ``now`` (see the module docstring).

    Args:
        liveness: The samples so far (stacks, CPU times, checkpoints seen).
        now: The sampler's clock.
        policy: The windows.
        last_sign_of_life: The latest other sign (a heartbeat file's touch), if any.
        expected_ranks: How many ranks the job has (0: unknown): a rank never sampled leaves stacks undecided.
    """
    now = aware(now)
    window, basis, detail = silent_window(policy, liveness.checkpoint_times)
    motion, since = stack_motion(liveness, expected_ranks)
    marks = [t for t in (last_sign_of_life, liveness.first_sample_at) if t is not None]
    marks += list(liveness.checkpoint_times[-1:])
    quiet = _since(now, max((aware(t) for t in marks), default=None)) or 0.0
    ranks = tuple(
        RankSilence(rank=r.rank, node=r.node, silent_for_s=_since(now, r.unchanged_since or r.cpu_unchanged_since))
        for r in liveness.ranks
    )
    common = {"window_s": window, "basis": basis, "window_detail": detail, "ranks": ranks}
    if motion is StackMotion.ADVANCING:
        return HangVerdict(hung=False, silent_for_s=quiet, summary="progressing: the ranks' stacks move", **common)
    if quiet < window:
        summary = f"no verdict: a sign of life {quiet:.0f} s ago, within the {window:.0f} s window ({basis})"
        return HangVerdict(hung=False, silent_for_s=quiet, summary=summary, **common)
    if motion is StackMotion.PARKED and since is not None and _since(now, since) is not None:
        parked = _since(now, since) or 0.0
        if parked >= window:
            return _parked_verdict(liveness, parked, common)
    if motion is StackMotion.UNKNOWN and not any(r.signature for r in liveness.ranks):
        flat = [r.cpu_unchanged_since for r in liveness.ranks if r.cpu_time_s is not None]
        if flat and len(flat) == len(liveness.ranks) and all(t is not None for t in flat) and liveness.samples >= 2:
            idle = _since(now, max(t for t in flat if t is not None)) or 0.0
            if idle >= window:
                summary = (
                    f"hung: no stack could be read; every rank's CPU time flat for {idle:.0f} s and no checkpoint "
                    f"or heartbeat (window {window:.0f} s, {basis}: {detail})"
                )
                stalled = tuple(r.rank for r in liveness.ranks)
                return HangVerdict(hung=True, silent_for_s=idle, stalled_ranks=stalled, summary=summary, **common)
    summary = f"no verdict: stacks {motion.value}, quiet {quiet:.0f} s of a {window:.0f} s window ({basis})"
    return HangVerdict(hung=False, silent_for_s=quiet, summary=summary, **common)


def _parked_verdict(liveness: LivenessState, parked: float, common: dict[str, object]) -> HangVerdict:
    """Every rank unchanged for the window, most inside a collective: the others (if any) are the culprits."""
    waiting = [r for r in liveness.ranks if r.signature and r.in_collective]
    odd = [r for r in liveness.ranks if r.signature and not r.in_collective]
    where = waiting[0].top if waiting else "a collective"
    summary = (
        f"hung: {len(waiting)} rank(s) parked in {where} with unchanged stacks for {parked:.0f} s and no new "
        f"checkpoint (window {common['window_s']:.0f} s, {common['basis']}: {common['window_detail']}); "
        "CPU time not counted (NCCL busy-polls while hung)"
    )
    culprit = odd[0] if len(odd) == 1 else None
    if culprit is not None:
        summary += f"; likely culprit rank {culprit.rank} on {culprit.node or '?'}, outside it at {culprit.top}"
    elif odd:
        summary += f"; {len(odd)} ranks outside it: " + ", ".join(str(r.rank) for r in odd[:8])
    return HangVerdict.model_validate(
        {
            **common,
            "hung": True,
            "silent_for_s": parked,
            "stalled_ranks": tuple(r.rank for r in liveness.ranks if r.signature),
            "culprit_rank": culprit.rank if culprit else None,
            "culprit_node": culprit.node if culprit else "",
            "confidence": _CONFIDENCE_BEHIND if culprit else 0.0,
            "summary": summary,
        }
    )
