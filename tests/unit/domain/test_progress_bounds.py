"""A job's progress state stays bounded whatever its rank count: a one-task job whose log names 16,384 ranks keeps
its state under ``PROGRESS_STATE_MAX_BYTES``, its polls' CPU bounded, and says that it tracks only some ranks."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from activities.logs.job_watcher import progress_samples
from activities.logs.line import LogLine, decode_line
from workflows.domain.bounds import MAX_TRACKED_RANKS, PROGRESS_STATE_MAX_BYTES
from workflows.domain.hang import HangPolicy
from workflows.domain.progress import ProgressState, observe
from workflows.policy.hang import assess_hang

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RANKS = 16_384


def _poll(second: int, ranks: range) -> list[LogLine]:
    """One second of the job's single log: a step line of each of ``ranks`` (``rank=N node=... step=K ...``)."""
    stamp = (T0 + timedelta(seconds=second)).strftime("%Y-%m-%d %H:%M:%S")
    return [
        decode_line(
            "/jobs/one-task.out",
            None,
            None,
            r * 100,
            f"{stamp} rank={r} node=gpu-node-with-a-long-name-{r // 8:05d} step={second} loss=2.{r % 97:02d} "
            f"step_time=0.{500 + r % 300}s".encode(),
        )
        for r in ranks
    ]


def test_a_job_naming_16384_ranks_keeps_a_bounded_state_and_says_so() -> None:
    state = ProgressState()
    worst_poll_s = 0.0
    for second in range(1, 81):  # every tracked rank's rings fill up (64 values each)
        # Every rank's line on 3 polls (the parse of 16,384 lines is the slow part of this test), rank 0-199 on all.
        lines = _poll(second, range(RANKS if second in (1, 40, 80) else 200))
        samples = progress_samples(lines, T0 + timedelta(seconds=second), {})
        started = time.process_time()
        state = observe(state, samples, T0 + timedelta(seconds=second, milliseconds=500))
        worst_poll_s = max(worst_poll_s, time.process_time() - started)
    size = len(state.model_dump_json())
    assert size < PROGRESS_STATE_MAX_BYTES, size
    assert len(state.ranks) == MAX_TRACKED_RANKS and len(state.ranks[0].gaps_s) == 64
    assert state.untracked is not None and state.untracked.highest_rank == RANKS - 1
    assert state.untracked.last_step == 80
    assert state.ranks_note.startswith(f"tracking {MAX_TRACKED_RANKS} of at least {RANKS} ranks one by one")
    # Folding 16,384 step lines into the state: ~0.1 s here; the bound leaves room for a loaded machine.
    assert worst_poll_s < 2.0, worst_poll_s


def test_untracked_ranks_that_step_keep_the_job_from_being_called_hung() -> None:
    tracked = [decode_line("/j.out", None, None, 0, f"rank={r} step=1".encode()) for r in range(MAX_TRACKED_RANKS)]
    state = observe(ProgressState(), progress_samples(tracked, T0, {}), T0)
    late = T0 + timedelta(seconds=600)
    others = [decode_line("/j.out", None, None, 1, f"rank={MAX_TRACKED_RANKS + 5} step=2".encode())]
    stepping = observe(state, progress_samples(others, late, {}), late)
    policy = HangPolicy(override_s=300.0)
    assert assess_hang(state, late, policy).hung  # only the tracked ranks: silent for 600 s
    verdict = assess_hang(stepping, late + timedelta(seconds=10), policy)
    assert not verdict.hung
    assert "progressing: last step 2" in verdict.summary
    silent = assess_hang(stepping, late + timedelta(seconds=400), policy)
    assert silent.hung and "tracking 128 of at least 134 ranks" in silent.summary
