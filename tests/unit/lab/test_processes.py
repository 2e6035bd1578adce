from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local.processes import (
    LabError,
    descendants,
    is_alive,
    kill_and_wait,
    pids_holding,
    pids_holding_any,
    port_is_free,
    read_owned_pid,
    require_free_ports,
    spawn,
    write_pid_file,
)


def test_spawned_process_is_recognised_as_ours(tmp_path: Path) -> None:
    pid = spawn([sys.executable, "-c", "import time; time.sleep(30)"], log_file=tmp_path / "x.log",
                pid_file=tmp_path / "x.pid")  # fmt: skip
    try:
        assert read_owned_pid(tmp_path / "x.pid", tmp_path) == pid
    finally:
        kill_and_wait([pid])
    assert not is_alive(pid)
    assert read_owned_pid(tmp_path / "x.pid", tmp_path) is None
    assert not (tmp_path / "x.pid").exists()  # a stale pid file is removed


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # Same pid, different start time: as if the pid had been recycled by an unrelated process.
        (tmp_path / "y.pid").write_text(f"{proc.pid} 1\n")
        assert read_owned_pid(tmp_path / "y.pid", tmp_path) is None
        write_pid_file(tmp_path / "y.pid", proc.pid)
        assert read_owned_pid(tmp_path / "y.pid", tmp_path) == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_garbage_pid_file(tmp_path: Path) -> None:
    (tmp_path / "z.pid").write_text("not a pid")
    assert read_owned_pid(tmp_path / "z.pid", tmp_path) is None


def test_taken_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(LabError, match=f"temporal :{port}.*REBOUND_LAB_TEMPORAL_PORT"):
            require_free_ports({"temporal": port})


def test_descendants_and_open_file_holders(tmp_path: Path) -> None:
    held = tmp_path / "held.log"
    held.write_text("")
    script = (
        f"import subprocess,sys,time; f=open({str(held)!r}); "
        "subprocess.Popen([sys.executable,'-c','import time; time.sleep(30)']); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not descendants([parent.pid]) or not pids_holding(held)):
            time.sleep(0.05)
        kids = descendants([parent.pid])
        assert len(kids) == 1
        assert pids_holding(held) == [parent.pid]
        other = tmp_path / "other.log"
        other.write_text("")
        # One walk of /proc answers for every path; the child inherited no descriptor (close_fds).
        assert pids_holding_any([held, other]) == {held: [parent.pid], other: []}
    finally:
        kill_and_wait([parent.pid, *descendants([parent.pid])], term_timeout_s=2)
        parent.wait()
