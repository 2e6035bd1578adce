"""The resume check tells the new attempt's lines from the old attempt's last words by their place in the file
(``activities.logs.successor``): the pure rule, and ``job_wait_resume`` on a torchrun job's appended
``slurm-%j.out`` as the lab wrote it (issue 11's torchrun x hang: the old torch elastic agent's SIGTERM traceback,
read only once the new attempt ran, was judged the new attempt's crash)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.testing import ActivityEnvironment

from activities.logs.line import LogLine, decode_line
from activities.logs.successor import previous_attempt_over, successor_lines
from activities.logs.watch import WatchActivities
from activities.slurm.snapshots import SnapshotCache
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.loop import ResumeOutcome, WaitResumeInput, WaitResumeResult
from workflows.domain.slurm import JobState

T0 = datetime(2026, 12, 5, 8, 46, 45, tzinfo=UTC)


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# What the lab's slurm-5.out held between the hang's requeue and the new attempt's first line (trimmed): no line
# has a leading timestamp; srun's "Exited with exit code 1" lines are culprit findings (the SignalException was one
# too, a user bug, until it was read as what it is: the agent stopped by Slurm's SIGTERM).
OLD_ATTEMPT_LAST_WORDS = [
    "slurmstepd-n1: error: *** JOB 5 ON n1 CANCELLED AT 2026-12-05T08:46:45 DUE TO JOB REQUEUE ***",
    "slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-12-05T08:46:45 DUE TO JOB REQUEUE ***",
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
    "W1205 08:46:45.278000 31645 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
    "shutting down workers",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in '
    "_invoke_run",
    "    time.sleep(monitor_interval)",
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in '
    "_terminate_process_handler",
    '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 31645 got signal: 15",
    "srun: error: n1: task 0: Exited with exit code 1",
    "srun: launch/slurm: _step_signal: Terminating StepId=5.0",
    "srun: error: n2: task 1: Exited with exit code 1",
]


def _append(path: Path, *lines: str) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(line + "\n")


def _new_attempt_start(at: datetime) -> list[str]:
    return [
        f"{_stamp(at)} [INFO] batch job_id=5 restart=1 nodes=n[1-2] launcher=torchrun nproc_per_node=2",
        "*****************************************",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
    ]


def _step(at: datetime, rank: int, step: int) -> str:
    return f"[rank{rank}]:{_stamp(at)} [INFO] rank={rank}/4 node=n1 step={step} loss=0.5 step_time=0.1s"


def _lines(path: Path, texts: list[str]) -> list[LogLine]:
    out: list[LogLine] = []
    offset = 0
    for text in texts:
        out.append(decode_line(str(path), None, None, offset, text.encode()))
        offset += len(text.encode()) + 1
    return out


# ----- the rule ---------------------------------------------------------------------------------------------------


def test_unstamped_lines_below_the_boundary_are_the_old_attempts() -> None:
    path = Path("/runs/slurm-5.out")
    lines = _lines(path, OLD_ATTEMPT_LAST_WORDS)
    end = lines[-1].offset + len(lines[-1].text) + 1
    kept, boundary = successor_lines(lines, read_from={str(path): 0}, boundary={str(path): end}, since=T0)
    assert kept == [] and boundary == {str(path): end}


def test_a_line_stamped_after_the_restart_moves_the_boundary_down_to_it() -> None:
    path = Path("/runs/slurm-5.out")
    new = _new_attempt_start(T0 + timedelta(seconds=10))
    lines = _lines(path, [*OLD_ATTEMPT_LAST_WORDS, *new, "RuntimeError: CUDA error: an illegal memory access"])
    end = lines[-1].offset + len(lines[-1].text) + 1
    kept, boundary = successor_lines(lines, read_from={}, boundary={str(path): end}, since=T0)
    first_new = lines[len(OLD_ATTEMPT_LAST_WORDS)]
    assert [line.text for line in kept] == [*new, "RuntimeError: CUDA error: an illegal memory access"]
    assert boundary == {str(path): first_new.offset}


def test_before_the_old_attempt_is_seen_over_only_stamped_lines_are_kept() -> None:
    path = Path("/runs/slurm-5.out")
    new = _new_attempt_start(T0 + timedelta(seconds=10))
    kept, boundary = successor_lines(
        _lines(path, [*OLD_ATTEMPT_LAST_WORDS, *new]), read_from={}, boundary=None, since=T0
    )
    assert [line.text for line in kept] == [new[0]] and boundary is None


def test_a_file_read_again_from_0_or_not_in_the_boundary_is_the_new_attempts() -> None:
    rewritten, other = Path("/runs/slurm-5.out"), Path("/runs/new.log")
    lines = [*_lines(rewritten, ["Traceback (most recent call last):"]), *_lines(other, ["Killed"])]
    kept, boundary = successor_lines(lines, read_from={str(rewritten): 900}, boundary={str(rewritten): 900}, since=T0)
    assert kept == lines and boundary == {str(rewritten): 0}


def test_the_previous_attempt_is_over_once_the_requeue_is_counted_and_no_longer_completing() -> None:
    sched = FakeScheduler()
    sched.requeue_completes_instantly = False
    job = sched.submit(2)
    assert not previous_attempt_over(job, 1)  # not requeued yet
    requeued = sched.requeue_by_slurm(job.job_id)
    assert requeued.state is JobState.COMPLETING and not previous_attempt_over(requeued, 1)
    assert previous_attempt_over(sched.settle(job.job_id), 1)
    assert not previous_attempt_over(None, 1)


# ----- job_wait_resume on the appended file ----------------------------------------------------------------------


class _Job:
    """A torchrun job of the fake scheduler whose every attempt appends to one slurm-%j.out."""

    def __init__(self, tmp: Path) -> None:
        self.sched = FakeScheduler()
        self.job = self.sched.submit(2)
        self.log = tmp / f"slurm-{self.job.job_id}.out"
        self.patterns = (str(tmp / "slurm-%j.out"),)
        started = datetime.now(UTC) - timedelta(seconds=60)
        _append(self.log, *(_step(started + timedelta(seconds=i), 0, i) for i in range(1, 29)))
        # Where the watch stopped reading when the hang was detected (the workflow's log offsets).
        self.offsets = {str(self.log): self.log.stat().st_size}
        # Slurm starts the next attempt seconds later (cred_expire): the file is older than it, as on the lab.
        self.sched.clock = lambda: datetime.now(UTC) + timedelta(seconds=2)

    def wait_input(self, not_before: datetime) -> WaitResumeInput:
        return WaitResumeInput(
            job_id=self.job.job_id,
            log_patterns=self.patterns,
            offsets=self.offsets,
            expected_restart_count=1,
            poll_interval_s=0.05,
            not_before=not_before,
        )

    async def wait_resume(self, inp: WaitResumeInput) -> WaitResumeResult:
        watch = WatchActivities(SnapshotCache(self.sched, max_age_s=0))
        return await asyncio.wait_for(ActivityEnvironment().run(watch.wait_resume, inp), timeout=10)


async def test_old_attempts_last_words_read_after_the_new_attempt_started_are_not_its_failure(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    restarted = datetime.now(UTC)
    job.sched.requeue_by_slurm(job.job.job_id)
    _append(job.log, *OLD_ATTEMPT_LAST_WORDS)  # written while the old attempt was torn down
    job.sched.schedule()  # the new attempt runs before the resume check first reads (a slow worker)
    new = job.sched.clock()
    _append(job.log, *_new_attempt_start(new))  # torchrun takes seconds to start the ranks
    waiting = asyncio.create_task(job.wait_resume(job.wait_input(restarted)))
    await asyncio.sleep(0.3)
    _append(job.log, _step(new, 0, 21), _step(new, 1, 21))
    result = await waiting
    assert result.outcome is ResumeOutcome.RESUMED, result.findings
    assert result.step == 21 and result.findings == ()


async def test_a_new_attempt_that_crashes_right_after_its_first_stamped_line_still_failed_again(
    tmp_path: Path,
) -> None:
    job = _Job(tmp_path)
    restarted = datetime.now(UTC)
    job.sched.requeue_by_slurm(job.job.job_id)
    _append(job.log, *OLD_ATTEMPT_LAST_WORDS)
    job.sched.schedule()
    _append(
        job.log,
        *_new_attempt_start(job.sched.clock()),
        "Traceback (most recent call last):",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    result = await job.wait_resume(job.wait_input(restarted))
    assert result.outcome is ResumeOutcome.FAILED_AGAIN
    assert [f.text for f in result.findings if f.culprit] == [
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    ]


async def test_unstamped_lines_after_the_old_attempt_was_seen_over_are_the_new_attempts(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    restarted = datetime.now(UTC)
    job.sched.requeue_by_slurm(job.job.job_id)
    _append(job.log, *OLD_ATTEMPT_LAST_WORDS)
    waiting = asyncio.create_task(job.wait_resume(job.wait_input(restarted)))
    await asyncio.sleep(0.3)  # it polls the pending job: the old attempt's output is complete
    assert not waiting.done()
    job.sched.schedule()
    _append(job.log, "Traceback (most recent call last):", "RuntimeError: CUDA error: an illegal memory access")
    result = await waiting
    assert result.outcome is ResumeOutcome.FAILED_AGAIN
    assert [f.text for f in result.findings if f.culprit] == ["RuntimeError: CUDA error: an illegal memory access"]


async def test_a_file_truncated_by_the_new_attempt_is_read_as_its_own(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    restarted = datetime.now(UTC)
    job.sched.requeue_by_slurm(job.job.job_id)
    _append(job.log, *OLD_ATTEMPT_LAST_WORDS)
    job.sched.schedule()
    # Slurm's default slurm-%j.out (no --open-mode=append) starts again empty with the new attempt.
    job.log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access\n")
    result = await job.wait_resume(job.wait_input(restarted))
    assert result.outcome is ResumeOutcome.FAILED_AGAIN
    assert [f.text for f in result.findings if f.culprit] == ["RuntimeError: CUDA error: an illegal memory access"]
