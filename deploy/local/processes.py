"""Starting, finding and stopping the lab's processes by pid file - never by name.

A pid file alone is not proof: pids are recycled. A recorded process counts as ours only if it is alive (not a
zombie) and either its start time matches the one we recorded, or (for daemons that write their own pid file)
its command line names this lab's state directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class LabError(RuntimeError):
    """A lab operation failed; the message says what to do."""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat), None if gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as dead (PID 1 here may reap late)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def write_pid_file(path: Path, pid: int) -> None:
    """Record a process we started as ``pid start_ticks``, atomically."""
    ticks = process_start_ticks(pid)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid} {ticks if ticks is not None else 0}\n")
    os.replace(tmp, path)


def read_owned_pid(path: Path, state_dir: Path) -> int | None:
    """The live process recorded in ``path`` if it is really ours, else None (a stale file is removed)."""
    try:
        parts = path.read_text().split()
        pid = int(parts[0])
    except (OSError, ValueError, IndexError):
        return None
    if is_alive(pid):
        if len(parts) > 1 and int(parts[1]) and process_start_ticks(pid) == int(parts[1]):
            return pid
        if any(str(state_dir) in arg for arg in cmdline(pid)):
            return pid
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def require_free_ports(ports: Mapping[str, int]) -> None:
    """Fail with a clear message naming every taken port and the setting that moves it."""
    taken = {name: port for name, port in ports.items() if not port_is_free(port)}
    if taken:
        listing = ", ".join(f"{name} :{port}" for name, port in taken.items())
        raise LabError(
            f"port(s) already in use by another process: {listing}. Stop that process, or move the lab with "
            "REBOUND_LAB_TEMPORAL_PORT / REBOUND_LAB_TEMPORAL_UI_PORT / REBOUND_LAB_SLURMCTLD_PORT / "
            "REBOUND_LAB_SLURMD_PORT_BASE / REBOUND_LAB_SLURMRESTD_PORT."
        )


def spawn(argv: Sequence[str], *, log_file: Path, pid_file: Path, env: Mapping[str, str] | None = None) -> int:
    """Start a long-running process in its own session, output to ``log_file``; record its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    write_pid_file(pid_file, proc.pid)
    return proc.pid


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
    """Run a short command; return stdout, or raise LabError with its stderr."""
    try:
        done = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as e:
        raise LabError(f"{argv[0]} not found: run `make install` (or `rebound lab up`) as root first") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from e
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def descendants(root_pids: Sequence[int]) -> list[int]:
    """Every descendant of the given processes (by walking /proc's parent links), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = list(root_pids)
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_and_wait(pids: Sequence[int], *, term_timeout_s: float = 10.0) -> None:
    """TERM, wait up to ``term_timeout_s``, then KILL what is left."""
    alive = [p for p in pids if is_alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + term_timeout_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if is_alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pids_holding(path: Path) -> list[int]:
    """Processes with an open file descriptor on ``path`` (how a node's slurmstepds are found)."""
    return pids_holding_any([path])[path]


def pids_holding_any(paths: Sequence[Path]) -> dict[Path, list[int]]:
    """For each of ``paths``, the processes holding it open: one walk of ``/proc`` for all of them (a 64-node lab
    running 1,000 jobs has ~3,000 processes; a walk per node took minutes)."""
    targets = {str(p): p for p in paths}
    holders: dict[Path, list[int]] = {p: [] for p in paths}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            held: set[Path] = set()
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    path = targets.get(os.readlink(fd))
                    if path is not None and path not in held:
                        held.add(path)
                        holders[path].append(int(entry.name))
    return holders


def wait_until(predicate: object, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``predicate()`` until true; raise LabError naming ``what`` on timeout."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise LabError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
