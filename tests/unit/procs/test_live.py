"""The activities against REAL processes and the real py-spy: a hung 3-rank "job" on this machine.

Each rank is ``fake_rank.py`` started with the environment srun gives a task (``SLURM_JOB_ID``,
``SLURM_PROCID``, ...). Ranks 0 and 2 wait in ``all_reduce_wait``; rank 1 sleeps in ``load_next_batch``: the
comparison of their stacks must single out rank 1. Needs ptrace rights over our own children (same user
suffices unless Yama forbids it); skipped, saying why, where py-spy cannot work at all.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.procs.activities import ProcsActivities
from activities.procs.proc import parse_stat
from activities.procs.pyspy import find_py_spy
from workflows.domain.procs import NodeProcessesInput, NodeProcessesResult, StackDumpInput, StackDumpResult
from workflows.policy.stacks import describe_stacks, odd_ranks

RANK_SCRIPT = Path(__file__).with_name("fake_rank.py")
PY_SPY = find_py_spy()

pytestmark = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed beside Python or on PATH")


class Job:
    """Real rank processes of one fake Slurm job; every process group is killed at the end."""

    def __init__(self) -> None:
        # A job id no real or concurrently tested job uses, so other processes on this machine never match.
        self.job_id = random.randrange(10**8, 2 * 10**8)
        self.groups: list[subprocess.Popen[str]] = []

    def start(self, procid: int, *args: str, ready: int = 1, wrap: bool = False, **env: str) -> list[int]:
        """Start one srun task (``wrap``: inside ``bash -c``); return the pids that printed ``ready``, by rank."""
        environ = dict(
            os.environ,
            SLURM_JOB_ID=str(self.job_id),
            SLURM_PROCID=str(procid),
            SLURM_LOCALID=str(procid),
            SLURM_STEP_ID="0",
            **env,
        )
        argv = [sys.executable, str(RANK_SCRIPT), *args]
        if wrap:  # "; exit $?" keeps bash from exec'ing python: the wrapper stays as the rank's parent
            argv = ["bash", "-c", " ".join(argv) + "; exit $?"]
        proc = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.groups.append(proc)
        assert proc.stdout is not None
        lines = [proc.stdout.readline().split()[1:] for _ in range(ready)]
        pids = [int(pid) for pid, _ in sorted(lines, key=lambda pid_rank: int(pid_rank[1]))]
        _wait_state(pids)
        return pids

    def kill(self) -> None:
        for proc in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.groups.clear()


def _wait_state(pids: list[int], state: str = "S", timeout_s: float = 10) -> None:
    """Until every pid is in ``state`` on two reads in a row (``S``: past its ``ready`` line, inside its wait)."""
    deadline = time.monotonic() + timeout_s
    streak = 0
    while streak < 2:
        states = [parse_stat(Path(f"/proc/{pid}/stat").read_text()).state for pid in pids]
        streak = streak + 1 if all(s == state for s in states) else 0
        assert time.monotonic() < deadline, f"ranks never reached {state}: {states}"
        time.sleep(0.05)


@pytest.fixture
def job() -> Iterator[Job]:
    j = Job()
    yield j
    j.kill()


@pytest.fixture
def hung_job(job: Job) -> dict[int, int]:
    """Three ranks, rank 1 the sleeper; rank -> pid."""
    return {rank: job.start(rank, "--sleeper", "1")[0] for rank in range(3)}


async def _list(acts: ProcsActivities, job_id: int) -> NodeProcessesResult:
    return await ActivityEnvironment().run(acts.rank_processes, NodeProcessesInput(job_id=job_id))


async def _dump(acts: ProcsActivities, job_id: int, **kw: float | int) -> StackDumpResult:
    return await ActivityEnvironment().run(acts.dump_stacks, StackDumpInput(job_id=job_id, **kw))


def _skip_without_ptrace(result: StackDumpResult) -> None:
    if result.stacks and all("permission denied" in s.error for s in result.stacks):
        pytest.skip(f"no ptrace rights over our own children here: {result.stacks[0].error}")


async def test_listing_finds_the_real_ranks(job: Job, hung_job: dict[int, int]) -> None:
    result = await _list(ProcsActivities("n1"), job.job_id)
    assert result.error == "" and result.node == "n1"
    assert [(p.rank, p.pid) for p in result.processes] == sorted(hung_job.items())
    now = datetime.now(UTC)
    for p in result.processes:
        assert (p.job_id, p.local_rank, p.step_id, p.rank_source) == (job.job_id, p.rank, "0", "SLURM_PROCID")
        assert (p.state, p.state_meaning) == ("S", "sleeping (interruptible wait)")
        assert p.comm.startswith("python") and str(RANK_SCRIPT) in p.cmdline
        assert p.threads == 1 and p.rss_bytes > 1_000_000 and 0 <= p.cpu_time_s < 5
        assert p.started_at is not None and now - timedelta(minutes=2) < p.started_at <= now + timedelta(seconds=1)
    wchans = {p.rank: p.wchan for p in result.processes}
    if any(wchans.values()):  # hidden (empty) under some kernels' pointer-hiding settings
        assert "sleep" in wchans[1] and "futex" in wchans[0], wchans


async def test_dump_singles_out_the_sleeper(job: Job, hung_job: dict[int, int]) -> None:
    acts = ProcsActivities("n1")
    result = await _dump(acts, job.job_id)
    _skip_without_ptrace(result)
    assert result.error == "" and result.tool.startswith("py-spy 0.")
    assert [(s.rank, s.pid, s.error, s.nonblocking) for s in result.stacks] == [
        (r, pid, "", False) for r, pid in sorted(hung_job.items())
    ]
    by_rank = {s.rank: s for s in result.stacks}
    for rank in (0, 2):
        frames = [f.split(" (")[0] for f in by_rank[rank].main_frames]
        assert frames[-3:] == ["all_reduce_wait", "main", "<module>"], by_rank[rank].main_frames
        assert "fake_rank.py:" in by_rank[rank].main_frames[-1]
    assert [f.split(" (")[0] for f in by_rank[1].main_frames] == ["load_next_batch", "main", "<module>"]
    assert by_rank[1].text.startswith(f'Thread {hung_job[1]} (idle): "MainThread"\n    load_next_batch (')
    assert odd_ranks(result.stacks) == [1]
    assert "odd: rank 1" in describe_stacks(result.stacks)
    print(f"\nlive dump of 3 ranks: {result.elapsed_s * 1000:.0f} ms")


async def test_a_stopped_rank_is_read_without_pausing(job: Job, hung_job: dict[int, int]) -> None:
    os.kill(hung_job[2], signal.SIGSTOP)
    try:
        _wait_state([hung_job[2]], "T")  # the signal is delivered asynchronously
        listed = await _list(ProcsActivities("n1"), job.job_id)
        assert {p.rank: p.state for p in listed.processes} == {0: "S", 1: "S", 2: "T"}
        result = await _dump(ProcsActivities("n1"), job.job_id)
        _skip_without_ptrace(result)
        stopped = result.stacks[2]
        assert (stopped.nonblocking, stopped.error) == (True, "")
        assert [f.split(" (")[0] for f in stopped.main_frames][-3:] == ["all_reduce_wait", "main", "<module>"]
        assert odd_ranks(result.stacks) == [1]
    finally:
        os.kill(hung_job[2], signal.SIGCONT)


async def test_wrapper_and_torchrun_style_launchers_are_not_ranks(job: Job) -> None:
    wrapped = job.start(0, "--sleeper", "1", wrap=True)  # bash -c "python fake_rank.py ...": rank 0 via SLURM_PROCID
    listed = await _list(ProcsActivities("n1"), job.job_id)
    assert [(p.rank, p.pid, p.rank_source) for p in listed.processes] == [(0, wrapped[0], "SLURM_PROCID")]
    assert any("also claims rank 0" in n for n in listed.notes), listed.notes

    workers = job.start(1, "--launch", "3", "--sleeper", "4", ready=3)  # torchrun-like: RANK 3..5 on node 1
    listed = await _list(ProcsActivities("n1"), job.job_id)
    # With RANK workers on the node, every SLURM_PROCID-only process counts as a launcher: the launcher itself,
    # and here also the wrapped task above (a job never mixes both styles on one node).
    assert sorted((p.rank, p.pid) for p in listed.processes) == sorted(zip((3, 4, 5), workers, strict=True))
    assert {p.rank_source for p in listed.processes} == {"RANK"}
    assert {p.local_rank for p in listed.processes} == {0, 1, 2}
    result = await _dump(ProcsActivities("n1"), job.job_id)
    _skip_without_ptrace(result)
    assert odd_ranks(result.stacks) == [4]


async def test_a_rank_that_exits_mid_dump_and_a_rank_we_may_not_trace(
    job: Job, hung_job: dict[int, int], tmp_path: Path
) -> None:
    # Wrappers around the real py-spy: one kills its target first, one runs as nobody (no ptrace rights).
    killer = tmp_path / "killer"
    killer.write_text(f'#!/bin/sh\nkill -9 "$3"\nsleep 0.2\nexec {PY_SPY} "$@"\n')
    killer.chmod(0o755)
    result = await _dump(ProcsActivities("n1", py_spy=killer), job.job_id)
    assert [s.error.split(" (")[0] for s in result.stacks] == [
        f"process {pid} exited before its stack was read" for _, pid in sorted(hung_job.items())
    ]
    assert result.error == "" and odd_ranks(result.stacks) == []

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("the permission case needs root (to drop to nobody) and setpriv")
    job.kill()
    survivors = {rank: job.start(rank, "--sleeper", "1")[0] for rank in range(2)}
    nobody = tmp_path / "nobody"
    nobody.write_text(f'#!/bin/sh\nexec {setpriv} --reuid=nobody --regid=nogroup --clear-groups {PY_SPY} "$@"\n')
    nobody.chmod(0o755)
    denied = await _dump(ProcsActivities("n1", py_spy=nobody), job.job_id)
    assert [s.pid for s in denied.stacks] == [survivors[0], survivors[1]]
    for s in denied.stacks:
        assert s.error.startswith(f"permission denied: the agent needs ptrace rights over pid {s.pid}"), s.error


@pytest.mark.parametrize("ranks", [8, 16])
async def test_dump_time_for_n_ranks(job: Job, ranks: int) -> None:
    pids = [job.start(rank, "--sleeper", "1")[0] for rank in range(ranks)]
    acts = ProcsActivities("n1")
    timings = []
    for _ in range(3):
        result = await _dump(acts, job.job_id)
        _skip_without_ptrace(result)
        assert [s.pid for s in result.stacks] == pids and all(not s.error for s in result.stacks)
        assert odd_ranks(result.stacks) == [1]
        timings.append(result.elapsed_s)
    print(f"\nlive dump of {ranks} ranks: " + ", ".join(f"{t * 1000:.0f} ms" for t in timings))
    assert min(timings) < 5  # generous: measured ~20-60 ms here; a regression to serial timeouts would show
