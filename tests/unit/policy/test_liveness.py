"""A job that prints no step line: its ranks' stacks and CPU times sampled by the node agents, its checkpoints,
and the hang verdict they give (``note_liveness``, ``stack_motion``, ``silent_window``, ``assess_silent_hang``)."""

from __future__ import annotations

from collections.abc import Sequence

from tests.unit.policy.test_progress_state import at, sample
from workflows.domain.hang import HangPolicy, WindowBasis
from workflows.domain.liveness import LivenessState, StackMotion
from workflows.domain.loop import WatchOutcome
from workflows.domain.procs import RankProcess, RankStack
from workflows.domain.progress import ProgressState, note_activity, observe
from workflows.domain.slurm import SlurmJob
from workflows.policy.hang import assess_hang, assess_silent_hang, silent_sample_interval, silent_window
from workflows.policy.stacks import in_collective, note_liveness, stack_motion
from workflows.policy.watch import WatchAction, WatchFacts, decide_poll

COLLECTIVE = (
    "wait (torch/distributed/distributed_c10d.py:2501)",
    "all_reduce (/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2498)",
    "wrapper (/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83)",
    "training_step (/home/u/train.py:40)",
)
DDP_BACKWARD = (
    "_engine_run_backward (/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py:768)",
    "backward (/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:289)",
    "backward (/opt/venv/lib/python3.11/site-packages/torch/_tensor.py:521)",
    "training_step (/home/u/train.py:41)",
)
OWN_CODE = ("load_batch (/home/u/data.py:12)", "training_step (/home/u/train.py:30)")
POLICY = HangPolicy(silent_default_s=600, floor_s=60, cadence_factor=2.0, cadence_min_intervals=2)


def _stack(rank: int, frames: Sequence[str], node: str = "n1") -> RankStack:
    return RankStack(rank=rank, pid=100 + rank, node=node, main_frames=tuple(frames))


def _proc(rank: int, cpu: float) -> RankProcess:
    return RankProcess(pid=100 + rank, rank=rank, job_id=7, node=f"n{rank // 2 + 1}", state="R", cpu_time_s=cpu)


def _samples(*rounds: tuple[float, Sequence[Sequence[str]]], cpu: Sequence[float] = ()) -> LivenessState:
    state = LivenessState()
    for i, (seconds, stacks) in enumerate(rounds):
        procs = [_proc(r, cpu[i]) for r in range(len(stacks))] if cpu else []
        state = note_liveness(state, at(seconds), [_stack(r, f) for r, f in enumerate(stacks)], procs)
    return state


def test_a_collective_is_recognised_through_wrappers_and_ddp_backward() -> None:
    assert in_collective(COLLECTIVE) and in_collective(DDP_BACKWARD)
    assert in_collective(("ncclKernel_AllReduce_RING_LL_Sum_float (libnccl.so.2)",))
    assert not in_collective(OWN_CODE)
    assert not in_collective(("wait (threading.py:320)", "get (queue.py:171)", "__next__ (dataloader.py:630)"))


def test_stacks_that_change_between_samples_are_advancing() -> None:
    one = _samples((0, [COLLECTIVE, COLLECTIVE]))
    assert stack_motion(one) == (StackMotion.UNKNOWN, None)  # one sample: nothing to compare
    moving = _samples((0, [COLLECTIVE, COLLECTIVE]), (60, [OWN_CODE, COLLECTIVE]))
    assert stack_motion(moving) == (StackMotion.ADVANCING, None)


def test_unchanged_stacks_mostly_in_a_collective_are_parked_since_the_last_change() -> None:
    parked = _samples((0, [OWN_CODE] * 4), (60, [COLLECTIVE] * 3 + [OWN_CODE]), (120, [COLLECTIVE] * 3 + [OWN_CODE]))
    assert stack_motion(parked) == (StackMotion.PARKED, at(60))
    still = _samples((0, [OWN_CODE, OWN_CODE]), (60, [OWN_CODE, OWN_CODE]))
    assert stack_motion(still) == (StackMotion.STILL, at(0))
    # A rank never sampled (its agent did not answer) leaves the motion unknown.
    assert stack_motion(parked, expected_ranks=8)[0] is StackMotion.UNKNOWN


def test_the_window_is_the_jobs_own_then_its_checkpoint_cadence_then_the_operators_default() -> None:
    own = silent_window(POLICY.model_copy(update={"override_s": 900.0}), [])
    assert own[:2] == (900.0, WindowBasis.OVERRIDE) and "hang= 900 s" in own[2]
    cadence = silent_window(POLICY, [at(0), at(300), at(700)])
    assert cadence[:2] == (800.0, WindowBasis.CHECKPOINT_CADENCE)
    assert "2 x the longest of 2 intervals between saves (400 s)" in cadence[2]
    default = silent_window(POLICY, [at(0), at(300)])
    assert default[:2] == (600.0, WindowBasis.DEFAULT) and "1 of 2 checkpoint intervals learned" in default[2]


def test_ranks_parked_in_a_collective_for_the_window_are_hung_whatever_their_cpu_time() -> None:
    rounds = [(s, [COLLECTIVE] * 3 + [OWN_CODE]) for s in (0, 300, 600, 700)]
    busy = _samples(*rounds, cpu=[10, 300, 600, 700])  # NCCL's proxy threads keep the CPU busy
    verdict = assess_silent_hang(busy, at(700), POLICY, expected_ranks=4)
    assert verdict.hung and verdict.basis is WindowBasis.DEFAULT and verdict.window_s == 600
    assert verdict.culprit_rank == 3 and verdict.stalled_ranks == (0, 1, 2, 3)
    assert "parked in wait (distributed_c10d.py)" in verdict.summary and "CPU time not counted" in verdict.summary
    early = assess_silent_hang(busy, at(500), POLICY, expected_ranks=4)
    assert not early.hung


def test_advancing_stacks_a_new_checkpoint_or_a_heartbeat_are_not_a_hang() -> None:
    moving = _samples((0, [COLLECTIVE]), (700, [OWN_CODE]))
    assert not assess_silent_hang(moving, at(700), POLICY).hung
    parked = _samples((0, [COLLECTIVE]), (700, [COLLECTIVE]))
    assert assess_silent_hang(parked, at(700), POLICY).hung
    assert not assess_silent_hang(parked, at(700), POLICY, last_sign_of_life=at(650)).hung
    saved = note_liveness(parked, at(701), [], checkpoint=("/ck/step=200", at(690)))
    assert not assess_silent_hang(saved, at(701), POLICY).hung


def test_without_stacks_only_cpu_time_flat_on_every_rank_for_the_window_counts() -> None:
    state = LivenessState()
    for seconds, cpu in ((0, 50.0), (300, 50.0), (700, 50.0)):
        state = note_liveness(state, at(seconds), [], [_proc(0, cpu), _proc(1, cpu)])
    verdict = assess_silent_hang(state, at(700), POLICY)
    assert verdict.hung and "CPU time flat for 700 s" in verdict.summary
    busy = LivenessState()
    for seconds, cpu in ((0, 50.0), (300, 80.0), (700, 90.0)):
        busy = note_liveness(busy, at(seconds), [], [_proc(0, cpu)])
    assert not assess_silent_hang(busy, at(700), POLICY).hung


def test_checkpoints_seen_are_remembered_once_each() -> None:
    state = note_liveness(LivenessState(), at(0), [], checkpoint=("/ck/a", at(-10)))
    state = note_liveness(state, at(60), [], checkpoint=("/ck/a", at(-10)))
    state = note_liveness(state, at(120), [], checkpoint=("/ck/b", at(100)))
    assert state.checkpoint_times == (at(-10), at(100)) and state.last_checkpoint == "/ck/b"


def test_a_checkpoint_rewritten_in_place_is_a_new_save() -> None:
    # Lightning's last.ckpt: the scanner names the same path after every save; its completion time moves.
    state = note_liveness(LivenessState(), at(0), [], checkpoint=("/ck/last.ckpt", at(-10)))
    state = note_liveness(state, at(30), [], checkpoint=("/ck/last.ckpt", at(20)))
    state = note_liveness(state, at(60), [], checkpoint=("/ck/last.ckpt", at(20)))
    assert state.checkpoint_times == (at(-10), at(20)) and state.last_checkpoint == "/ck/last.ckpt"


def test_two_ranks_one_waiting_in_a_collective_the_other_stuck_are_parked() -> None:
    # Two ranks: the peer waits in the all-reduce for the rank stuck in its own code (no strict majority exists).
    two = _samples((0, [OWN_CODE, OWN_CODE]), (30, [DDP_BACKWARD, OWN_CODE]), (60, [DDP_BACKWARD, OWN_CODE]))
    assert stack_motion(two) == (StackMotion.PARKED, at(30))
    verdict = assess_silent_hang(two, at(700), POLICY, expected_ranks=2)
    assert verdict.hung and verdict.culprit_rank == 1
    # Half of four ranks in a collective is neither a majority nor all but one: no verdict from stacks.
    half = _samples(
        (0, [OWN_CODE] * 4), (30, [COLLECTIVE] * 2 + [OWN_CODE] * 2), (60, [COLLECTIVE] * 2 + [OWN_CODE] * 2)
    )
    assert stack_motion(half)[0] is StackMotion.STILL
    # A single rank in its own code waits for nobody.
    alone = _samples((0, [OWN_CODE]), (30, [OWN_CODE]))
    assert stack_motion(alone)[0] is StackMotion.STILL


def test_a_silent_job_is_sampled_at_a_quarter_of_its_hang_window_within_bounds() -> None:
    # The operator's default window (600 s): every 150 s.
    assert silent_sample_interval(POLICY, [], least_s=15, most_s=300)[0] == 150
    # The job's own hang= 120 s: every 30 s, so its hang is seen within about 1.25 windows, not after 300 s.
    own = POLICY.model_copy(update={"override_s": 120.0})
    every, how = silent_sample_interval(own, [], least_s=15, most_s=300)
    assert every == 30 and "1/4 of the 120 s window (override)" in how
    # Learned from its checkpoints: saves 20 s apart give a 60 s window (the floor): every 15 s.
    assert silent_sample_interval(POLICY, [at(0), at(20), at(40)], least_s=15, most_s=300)[0] == 15
    # Bounded: never more often than least_s (each sample dumps every rank), never rarer than most_s.
    short = POLICY.model_copy(update={"override_s": 8.0})
    every, how = silent_sample_interval(short, [], least_s=5, most_s=300)
    assert every == 5 and "bounded to [5, 300] s" in how
    long = POLICY.model_copy(update={"override_s": 7200.0})
    assert silent_sample_interval(long, [], least_s=15, most_s=300)[0] == 300
    # The ceiling wins when the two cross: an operator who asks for samples every 30 s gets them.
    assert silent_sample_interval(short, [], least_s=60, most_s=30)[0] == 30


def test_a_heartbeat_only_job_gets_a_step_line_jobs_hang_verdict() -> None:
    policy = HangPolicy(startup_s=120.0)
    alive = note_activity(observe_empty(), 0, at(0))
    assert assess_hang(alive, at(121), policy).hung
    assert not assess_hang(alive, at(100), policy).hung
    assert not assess_hang(observe_empty(), at(121), policy).hung  # nothing ever heard: no verdict


def observe_empty() -> ProgressState:
    return ProgressState(watching_since=at(0))


def test_step_lines_still_decide_with_heartbeats_present() -> None:
    state = observe(ProgressState(), [sample(0, 1, 0)], at(0))
    assert assess_hang(note_activity(state, 0, at(50)), at(100), HangPolicy(startup_s=120.0)).hung is False


# ----- the watch's early return for a sample ------------------------------------------------------------------------
def _watch_facts(progress: ProgressState, *, due: bool, state: str = "RUNNING") -> WatchFacts:
    job = SlurmJob.model_validate({"job_id": 7, "state": state, "nodes": ("n1",), "task_count": 2})
    return WatchFacts(
        now=at(100), job=job, progress=progress, last_state=job.state, sample_due=due, hang=HangPolicy(startup_s=900)
    )


def test_a_running_job_without_step_lines_returns_for_a_due_sample() -> None:
    quiet = ProgressState(watching_since=at(0))
    decision = decide_poll(_watch_facts(quiet, due=True))
    assert decision.action is WatchAction.RETURN and decision.outcome is WatchOutcome.SAMPLE
    assert decide_poll(_watch_facts(quiet, due=False)).action is WatchAction.KEEP_WATCHING
    assert decide_poll(_watch_facts(quiet, due=True, state="PENDING")).action is WatchAction.KEEP_WATCHING
    # A job that logs steps, or touches its heartbeat, is watched by the step-line rules: no sampling.
    stepping = observe(ProgressState(), [sample(0, 1, 90)], at(95))
    assert decide_poll(_watch_facts(stepping, due=True)).action is WatchAction.KEEP_WATCHING
    beating = note_activity(quiet, 0, at(90))
    assert decide_poll(_watch_facts(beating, due=True)).action is WatchAction.KEEP_WATCHING
