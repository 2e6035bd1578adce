"""The two node-agent activities over a fake /proc and a scripted stand-in for py-spy (ActivityEnvironment).

The stand-in behaves per pid as configured in a JSON file beside it, so every failure py-spy can report is
exercised: permission denied, a rank that exits mid-dump, a pausing read that hangs, unreadable output.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio import activity
from temporalio.testing import ActivityEnvironment

import activities.procs.activities as procs_activities
from activities.procs.activities import ProcsActivities
from tests.unit.procs.fakeproc import CLK_TCK, PAGE_SIZE, FakeProc, slurm_env
from workflows.domain.procs import NodeProcessesInput, StackDumpInput, StackDumpResult
from workflows.domain.ranks import StepLayout
from workflows.policy.stacks import odd_ranks

JOB = 4242

FAKE_PY_SPY = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "behaviour.json")) as f:
    config = json.load(f)
with open(os.path.join(here, "calls.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["--version"]:
    if config.get("version_broken"):
        sys.exit("Error: cannot start")
    print("py-spy 9.9.9")
    sys.exit(0)
pid = sys.argv[sys.argv.index("--pid") + 1]
how = config["pids"].get(pid, "wait")
nonblocking = "--nonblocking" in sys.argv
if how == "pid_file":
    open(os.path.join(here, "running.pid"), "w").write(str(os.getpid()))
    time.sleep(60)
if how == "denied":
    sys.exit("Permission Denied: Try running again with elevated permissions by going 'sudo env ...'")
if how == "exits":
    import shutil
    shutil.rmtree(os.path.join(config["proc_root"], pid))
    sys.exit("Error: Failed to get process executable name. Check that the process is running.")
if how == "garbage":
    print("this is not a dump")
    sys.exit(0)
if how == "hangs_unless_nonblocking" and not nonblocking:
    time.sleep(60)
if how == "fails_unless_nonblocking" and not nonblocking:
    sys.exit("Error: Failed to get stack traces\\n\\nCaused by:\\n    0: Failed to suspend process")
func = {{"wait": "all_reduce_wait", "sleep": "load_next_batch"}}.get(how, "all_reduce_wait")
frames = [{{"name": func, "short_filename": "rank.py", "line": 10}}, {{"name": "<module>", "short_filename": "rank.py",
          "line": 20}}] + [{{"name": "pad", "short_filename": "p.py", "line": i}} for i in range(config.get("pad", 0))]
print(json.dumps([{{"thread_name": "MainThread", "os_thread_id": int(pid), "active": False, "owns_gil": False,
                   "frames": frames}}]))
"""


class Spy:
    """The stand-in py-spy: a script, its per-pid behaviour and a log of its calls."""

    def __init__(self, directory: Path, proc_root: Path) -> None:
        directory.mkdir()
        self.binary = directory / "py-spy"
        self.binary.write_text(FAKE_PY_SPY.format(python=sys.executable))
        self.binary.chmod(0o755)
        self.dir = directory
        self.config: dict[str, Any] = {"pids": {}, "proc_root": str(proc_root)}
        self.save()

    def save(self) -> None:
        (self.dir / "behaviour.json").write_text(json.dumps(self.config))

    def behave(self, **by_pid: str) -> None:
        self.config["pids"].update({k.removeprefix("p"): v for k, v in by_pid.items()})
        self.save()

    def calls(self) -> list[str]:
        log = self.dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def spy(tmp_path: Path, fake: FakeProc) -> Spy:
    return Spy(tmp_path / "spy", fake.root)


def acts_for(fake: FakeProc, spy: Spy | None = None, py_spy: Path | None = None) -> ProcsActivities:
    binary = py_spy if py_spy is not None else (spy.binary if spy else None)
    return ProcsActivities("n1", py_spy=binary, proc_root=fake.root, clock_ticks_per_s=CLK_TCK, page_size=PAGE_SIZE)


async def dump(acts: ProcsActivities, env: ActivityEnvironment | None = None, **kw: Any) -> StackDumpResult:
    return await (env or ActivityEnvironment()).run(acts.dump_stacks, StackDumpInput(job_id=JOB, **kw))


def test_registered_under_the_convention_names() -> None:
    # Workflows call them by these strings on the node's task queue.
    names = [
        activity._Definition.must_from_callable(f).name
        for f in (ProcsActivities.rank_processes, ProcsActivities.dump_stacks)
    ]
    assert names == ["node_rank_processes", "node_dump_stacks"]


def test_inputs_are_validated() -> None:
    with pytest.raises(ValidationError):
        StackDumpInput(job_id=0)
    with pytest.raises(ValidationError):
        StackDumpInput(job_id=1, timeout_s=0)
    with pytest.raises(ValidationError):
        StackDumpInput(job_id=1, max_chars_per_rank=10)
    with pytest.raises(ValidationError):
        NodeProcessesInput(job_id=-3)


async def test_rank_processes_activity(fake: FakeProc) -> None:
    fake.add(11, env=slurm_env(JOB, 1), state="D")
    fake.add(10, env=slurm_env(JOB, 0))
    result = await ActivityEnvironment().run(acts_for(fake).rank_processes, NodeProcessesInput(job_id=JOB))
    assert [(p.rank, p.pid, p.state) for p in result.processes] == [(0, 10, "S"), (1, 11, "D")]
    assert result.model_validate_json(result.model_dump_json()) == result


async def test_rank_processes_report_the_slurm_task_and_srun_layout(fake: FakeProc) -> None:
    layout = {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_DISTRIBUTION": "cyclic"}
    fake.add(10, env=slurm_env(JOB, 0, 0, SLURM_STEP_NUM_TASKS="4", **layout))
    fake.add(11, env=slurm_env(JOB, 2, 1, SLURM_STEP_NUM_TASKS="4", **layout))
    result = await ActivityEnvironment().run(acts_for(fake).rank_processes, NodeProcessesInput(job_id=JOB))
    assert [(p.rank, p.task, p.world_size) for p in result.processes] == [(0, 0, 4), (2, 2, 4)]
    assert result.step_layout == StepLayout(nodes=("n1", "n2"), tasks_per_node=(2, 2), distribution="cyclic")


async def test_torchrun_workers_report_their_launcher_task_and_group(fake: FakeProc) -> None:
    # torchrun under srun --ntasks-per-node=1 on the second node: the launcher (SLURM_PROCID=1) and two workers
    fake.add(20, env=slurm_env(JOB, 1, 0), argv=("/usr/bin/python3", "-m", "torch.distributed.run"))
    worker = {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4", "GROUP_RANK": "1"}
    fake.add(21, env=slurm_env(JOB, 1, 0, RANK="2", LOCAL_RANK="0", **worker), ppid=20)
    fake.add(22, env=slurm_env(JOB, 1, 0, RANK="3", LOCAL_RANK="1", **worker), ppid=20)
    result = await ActivityEnvironment().run(acts_for(fake).rank_processes, NodeProcessesInput(job_id=JOB))
    got = [(p.rank, p.task, p.local_rank, p.local_world_size, p.world_size) for p in result.processes]
    assert got == [(2, 1, 0, 2, 4), (3, 1, 1, 2, 4)]
    assert result.step_layout is None  # the step's tasks are launchers, not ranks


async def test_an_unreadable_layout_is_a_note_not_a_failure(fake: FakeProc) -> None:
    fake.add(10, env=slurm_env(JOB, 0, SLURM_STEP_NODELIST="n[1-", SLURM_STEP_TASKS_PER_NODE="1"))
    result = await ActivityEnvironment().run(acts_for(fake).rank_processes, NodeProcessesInput(job_id=JOB))
    assert result.step_layout is None and any("layout unreadable" in n for n in result.notes)
    assert [p.rank for p in result.processes] == [0]


async def test_every_per_rank_failure_is_reported_not_raised(fake: FakeProc, spy: Spy) -> None:
    for rank, pid in enumerate(range(100, 106)):
        fake.add(pid, env=slurm_env(JOB, rank))
    spy.behave(p100="wait", p101="sleep", p102="denied", p103="exits", p104="garbage", p105="wait")
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    result = await dump(acts_for(fake, spy), env)
    assert (result.node, result.tool, result.error) == ("n1", "py-spy 9.9.9", "")
    by_rank = {s.rank: s for s in result.stacks}
    assert [s.rank for s in result.stacks] == [0, 1, 2, 3, 4, 5]
    assert by_rank[0].main_frames == ("all_reduce_wait (rank.py:10)", "<module> (rank.py:20)")
    assert by_rank[0].text.startswith('Thread 100 (idle): "MainThread"') and by_rank[0].error == ""
    assert by_rank[1].main_frames[0] == "load_next_batch (rank.py:10)"
    assert by_rank[2].error.startswith("permission denied: the agent needs ptrace rights over pid 102")
    assert by_rank[3].error.startswith("process 103 exited before its stack was read")
    assert by_rank[4].error.startswith("unreadable py-spy output") and by_rank[4].text == "this is not a dump"
    assert odd_ranks(result.stacks) == [1]
    assert beats[0] == (0, 6)  # progress heartbeats from the start: (dumped, total)
    # Neither the denied rank (no rights either way) nor the one that exited is retried; unparseable output neither.
    assert [sum(f"--pid {pid} " in c for c in spy.calls()) for pid in (102, 103, 104)] == [1, 1, 1]
    assert not by_rank[2].nonblocking


async def test_stopped_or_d_state_ranks_are_read_without_pausing(fake: FakeProc, spy: Spy) -> None:
    fake.add(100, env=slurm_env(JOB, 0), state="T")
    fake.add(101, env=slurm_env(JOB, 1), state="D")
    fake.add(102, env=slurm_env(JOB, 2), state="S")
    result = await dump(acts_for(fake, spy))
    assert [s.nonblocking for s in result.stacks] == [True, True, False]
    dumps = sorted(c for c in spy.calls() if c.startswith("dump"))
    assert dumps == [
        "dump --pid 100 --json --nonblocking",
        "dump --pid 101 --json --nonblocking",
        "dump --pid 102 --json",
    ]


async def test_a_failed_or_hung_pausing_read_is_retried_without_pausing(fake: FakeProc, spy: Spy) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    fake.add(101, env=slurm_env(JOB, 1))
    spy.behave(p100="hangs_unless_nonblocking", p101="fails_unless_nonblocking")
    result = await dump(acts_for(fake, spy), timeout_s=1.0)
    assert [(s.nonblocking, s.error, s.main_frames[:1]) for s in result.stacks] == [
        (True, "", ("all_reduce_wait (rank.py:10)",)),
        (True, "", ("all_reduce_wait (rank.py:10)",)),
    ]
    assert 1.0 <= result.stacks[0].elapsed_s < 5


async def test_text_is_bounded_per_rank(fake: FakeProc, spy: Spy) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    spy.config["pad"] = 2000
    spy.save()
    (s,) = (await dump(acts_for(fake, spy), max_chars_per_rank=500)).stacks
    assert len(s.text) <= 500 and s.text.endswith("more chars cut]")
    assert s.main_frames[0] == "all_reduce_wait (rank.py:10)" and len(s.main_frames) == 128


async def test_missing_or_broken_py_spy_is_a_per_rank_error(fake: FakeProc, spy: Spy, tmp_path: Path) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    fake.add(101, env=slurm_env(JOB, 1))
    missing = await dump(acts_for(fake, py_spy=tmp_path / "no" / "py-spy"))
    assert missing.error.startswith(f"py-spy at {tmp_path / 'no' / 'py-spy'} does not run: cannot run")
    assert [s.error for s in missing.stacks] == [missing.error] * 2 and missing.tool == ""
    spy.config["version_broken"] = True
    spy.save()
    broken = await dump(acts_for(fake, spy))
    assert broken.error.endswith("does not run: Error: cannot start") and len(broken.stacks) == 2


async def test_py_spy_not_found_anywhere(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    monkeypatch.setattr(procs_activities, "find_py_spy", lambda configured: None)
    result = await dump(acts_for(fake))
    assert result.error.startswith("py-spy not found") and result.stacks[0].error == result.error


async def test_no_rank_on_this_node(fake: FakeProc, spy: Spy, tmp_path: Path) -> None:
    result = await dump(acts_for(fake, spy))
    assert result.stacks == () and result.error == f"no process of job {JOB} on this node"
    gone = await dump(ProcsActivities("n1", proc_root=tmp_path / "nope"))
    assert gone.error.startswith("cannot list")


async def test_cancel_mid_dump_kills_py_spy(fake: FakeProc, spy: Spy) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    spy.behave(p100="pid_file")
    env = ActivityEnvironment()
    task = asyncio.create_task(dump(acts_for(fake, spy), env, timeout_s=60))
    pid_file = spy.dir / "running.pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    pid = int(pid_file.read_text())
    env.cancel()
    with pytest.raises(BaseException) as caught:  # the SDK's CancelledError, raised out of run()
        await task
    assert "Cancel" in type(caught.value).__name__
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
