"""node-crash against a harmless fake node: copies of sleep/bash named slurmd/slurmstepd, never real daemons."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from deploy.demo import inject
from deploy.demo.procs import descendants, exe_name, find_node_processes, is_alive, pids_with_open_file, read_stat
from deploy.local.layout import LabLayout

pytestmark = pytest.mark.timeout(30)

# The fake stepd: a bash named slurmstepd that keeps the node's slurmd log open (as real stepds do) and runs a
# task tree two levels deep.
STEPD_SCRIPT = 'exec 3>>"$1"; /bin/sh -c "sleep 300 & sleep 300; :" & sleep 300 & wait'


class FakeCluster:
    def __init__(self, layout: LabLayout, bin_dir: Path) -> None:
        self.layout = layout
        self.bin = bin_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        layout.log.mkdir(parents=True, exist_ok=True)
        layout.run.mkdir(parents=True, exist_ok=True)
        bin_dir.mkdir()
        # Debian's real binaries are slurmd-wlm (behind an alternatives symlink) and slurmstepd-wlm.
        shutil.copy2(shutil.which("bash") or "/bin/bash", bin_dir / "slurmd-wlm")
        shutil.copy2(shutil.which("bash") or "/bin/bash", bin_dir / "slurmstepd")

    def spawn(self, args: list[str], stdout: IO[str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, stdout=stdout)
        self.procs.append(proc)
        return proc

    def slurmd(self, node: str) -> subprocess.Popen[bytes]:
        """A fake slurmd with the real one's command line; short sleeps, so nothing outlives a kill for long."""
        script = "while :; do sleep 0.2; done"
        conf = str(self.layout.slurm_conf)
        return self.spawn([str(self.bin / "slurmd-wlm"), "-c", script, "slurmd", "-f", conf, "-N", node])

    def node(self, node: str, stepds: int = 1) -> tuple[subprocess.Popen[bytes], list[subprocess.Popen[bytes]]]:
        log = self.layout.slurmd_log(node)
        log.touch()
        slurmd = self.slurmd(node)
        self.layout.pid_file(f"slurmd-{node}").write_text(f"{slurmd.pid}\n")
        steps = [
            self.spawn([str(self.bin / "slurmstepd"), "-c", STEPD_SCRIPT, "stepd", str(log)]) for _ in range(stepds)
        ]
        return slurmd, steps

    def close(self) -> None:
        everything = descendants(p.pid for p in self.procs) + [p.pid for p in self.procs]
        for pid in everything:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    fake = FakeCluster(LabLayout(tmp_path / "lab"), tmp_path / "bin")
    yield fake
    fake.close()


def _wait_for_tree(layout: LabLayout, node: str, stepds: int, tasks: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = find_node_processes(layout.pid_file(f"slurmd-{node}"), layout.slurmd_log(node))
        if len(found.stepds) == stepds and len(found.tasks) >= tasks:
            return
        time.sleep(0.05)
    raise AssertionError(f"fake node {node} did not come up: {found}")


def test_finds_and_kills_exactly_the_node(cluster: FakeCluster) -> None:
    layout = cluster.layout
    slurmd, steps = cluster.node("n2", stepds=2)
    other_slurmd, other_steps = cluster.node("n1")
    # Holds n2's log open but is no slurmstepd (think `tail -f`): must be left alone.
    with layout.slurmd_log("n2").open("a") as f:
        bystander = cluster.spawn(["sleep", "300"], stdout=f)
    _wait_for_tree(layout, "n2", stepds=2, tasks=8)
    _wait_for_tree(layout, "n1", stepds=1, tasks=4)

    found = find_node_processes(layout.pid_file("slurmd-n2"), layout.slurmd_log("n2"))
    assert found.slurmd == slurmd.pid
    assert sorted(found.stepds) == sorted(p.pid for p in steps)
    assert bystander.pid in pids_with_open_file(layout.slurmd_log("n2"))
    assert bystander.pid not in found.all
    assert {exe_name(pid) for pid in found.tasks} <= {"sh", "dash", "sleep", "slurmstepd"}
    assert found.slurmd is not None and exe_name(found.slurmd) == "slurmd-wlm"

    record = inject.inject_node_crash(layout, "n2")

    assert (record.kind, record.node, record.rank, record.run) == ("node-crash", "n2", None, None)
    assert set(found.all) <= set(record.pids)
    deadline = time.monotonic() + 5
    while any(is_alive(pid) for pid in record.pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in record.pids if is_alive(pid)]
    assert all(is_alive(p.pid) for p in (other_slurmd, *other_steps, bystander))
    assert inject.read_injections(layout) == [record]
    # The node is now down: a second crash has nothing to kill.
    with pytest.raises(inject.NodeNotRunningError):
        inject.inject_node_crash(layout, "n2")


def test_stale_slurmd_pid_file_is_ignored(cluster: FakeCluster) -> None:
    layout = cluster.layout
    slurmd, _ = cluster.node("n3", stepds=0)
    slurmd.kill()
    slurmd.wait()
    found = find_node_processes(layout.pid_file("slurmd-n3"), layout.slurmd_log("n3"))
    assert found.slurmd is None and found.all == []
    with pytest.raises(inject.NodeNotRunningError, match=f"pid {slurmd.pid} .* is not slurmd"):
        inject.inject_node_crash(layout, "n3")


def _wait_dead(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if is_alive(pid)]


def test_frozen_node_hangs_until_reaped(cluster: FakeCluster) -> None:
    layout = cluster.layout
    slurmd2, steps2 = cluster.node("n2")
    slurmd3, steps3 = cluster.node("n3")
    _wait_for_tree(layout, "n2", stepds=1, tasks=4)
    _wait_for_tree(layout, "n3", stepds=1, tasks=4)
    frozen2 = [p.pid for p in steps2] + find_node_processes(layout.pid_file("slurmd-n2"), layout.slurmd_log("n2")).tasks
    frozen3 = [p.pid for p in steps3] + find_node_processes(layout.pid_file("slurmd-n3"), layout.slurmd_log("n3")).tasks

    # n2: nobody restarts it, the deadline reaps; n3: a new slurmd of n3 starting ("the host rebooted") reaps,
    # found by its command line before it writes any pid file.
    inject.inject_node_crash(layout, "n2", frozen_tasks=True, reap_after_s=3)
    inject.inject_node_crash(layout, "n3", frozen_tasks=True, reap_after_s=60)

    assert _wait_dead([slurmd2.pid, slurmd3.pid], 5) == []
    states = {pid: read_stat(pid) for pid in frozen2 + frozen3}
    assert all(st is not None and st.state == "T" for st in states.values()), states
    rebooted = cluster.slurmd("n3")
    assert _wait_dead(frozen3, 5) == []
    assert _wait_dead(frozen2, 10) == []
    assert is_alive(rebooted.pid)
