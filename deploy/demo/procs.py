"""Finding processes through ``/proc``: liveness, executables, open files, process trees.

Used by the injector to find what a simulated host crash must kill: a node's slurmd (from its pid file), the
slurmstepds that hold that node's slurmd log open, and every descendant of those stepds (batch scripts, srun,
training ranks). Every function takes the proc root so tests can point it elsewhere if they need to.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` we use."""

    pid: int
    comm: str
    state: str
    ppid: int
    start_ticks: int


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; ``None`` when the process is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # comm sits in parentheses and may itself contain spaces or ")": split at the last ")".
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    if len(fields) < 20:
        return None
    return ProcStat(
        pid=pid,
        comm=head.partition("(")[2],
        state=fields[0],
        ppid=int(fields[1]),
        start_ticks=int(fields[19]),
    )


def proc_start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """Start time of a process in clock ticks since boot, ``None`` if it is gone.

    Together with the pid it names a process uniquely, so a recycled pid is never mistaken for a rank.
    """
    stat = read_stat(pid, proc)
    return stat.start_ticks if stat else None


def is_alive(pid: int, proc: Path = PROC) -> bool:
    """Running or sleeping; zombies count as dead (the lab's PID 1 may reap them only every second or two)."""
    stat = read_stat(pid, proc)
    return stat is not None and stat.state not in ("Z", "X", "x")


def exe_name(pid: int, proc: Path = PROC) -> str | None:
    """Basename of the process's executable, or ``None`` if unreadable (gone, kernel thread, no permission)."""
    try:
        target = os.readlink(proc / str(pid) / "exe")
    except OSError:
        return None
    # An executable replaced on disk (package upgrade) reads as "/usr/sbin/slurmd (deleted)".
    return Path(target.removesuffix(" (deleted)")).name


def runs_program(pid: int, program: str, proc: Path = PROC) -> bool:
    """Whether the process executes ``program``, including Debian's alternatives targets: ``/usr/sbin/slurmd``
    is a symlink to ``slurmd-wlm``, and ``/proc/<pid>/exe`` shows the target."""
    name = exe_name(pid, proc)
    return name is not None and (name == program or name.startswith(program + "-"))


def read_cmdline(pid: int, proc: Path = PROC) -> list[str]:
    """The process's argv (empty if gone or a kernel thread)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def option_value(argv: list[str], flag: str) -> str | None:
    """The value after ``flag`` (``-N n2``) or glued to it (``-Nn2``), or ``None``."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag) and len(arg) > len(flag) and not arg.startswith("--"):
            return arg[len(flag) :]
    return None


def all_pids(proc: Path = PROC) -> list[int]:
    return [int(p.name) for p in proc.iterdir() if p.name.isdigit()]


def pids_with_open_file(path: Path, proc: Path = PROC) -> list[int]:
    """Every process with an open file descriptor on ``path`` (resolved, so symlinked state dirs match)."""
    wanted = os.path.realpath(path)
    found: list[int] = []
    for pid in all_pids(proc):
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) == wanted:
                    found.append(pid)
                    break
            except OSError:
                continue
    return sorted(found)


def children_map(proc: Path = PROC) -> dict[int, list[int]]:
    """ppid -> child pids, from one pass over ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid in all_pids(proc):
        stat = read_stat(pid, proc)
        if stat is not None:
            children.setdefault(stat.ppid, []).append(pid)
    return children


def descendants(roots: Iterable[int], proc: Path = PROC) -> list[int]:
    """All descendants of ``roots`` (not the roots themselves), breadth first."""
    children = children_map(proc)
    seen: set[int] = set(roots)
    queue = list(seen)
    out: list[int] = []
    while queue:
        pid = queue.pop(0)
        for child in children.get(pid, []):
            if child not in seen:
                seen.add(child)
                out.append(child)
                queue.append(child)
    return out


def ancestors(pid: int, proc: Path = PROC) -> set[int]:
    """``pid`` and every ancestor up to PID 1: processes a kill spree must never include (ourselves)."""
    chain: set[int] = set()
    current: int | None = pid
    while current and current not in chain:
        chain.add(current)
        stat = read_stat(current, proc)
        current = stat.ppid if stat else None
    return chain


@dataclass(frozen=True)
class NodeProcesses:
    """What runs for one lab node: its slurmd, its slurmstepds, and the stepds' descendants (the job)."""

    slurmd: int | None
    stepds: list[int]
    tasks: list[int]

    @property
    def all(self) -> list[int]:
        return ([self.slurmd] if self.slurmd is not None else []) + self.stepds + self.tasks


def read_pid_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def find_node_processes(
    pid_file: Path,
    slurmd_log: Path,
    *,
    slurmd_exe: str = "slurmd",
    stepd_exe: str = "slurmstepd",
    proc: Path = PROC,
) -> NodeProcesses:
    """Find a node's slurmd, its slurmstepds and their task trees.

    The slurmd counts only if its pid file names a live process whose executable really is ``slurmd`` (a stale
    pid file may name a recycled pid; Debian's real binary ``slurmd-wlm`` counts). slurmstepds are the
    ``slurmstepd`` executables holding ``slurmd_log`` open: with several slurmds on one host, that is the only
    thing tying a stepd to its node.
    """
    me = ancestors(os.getpid(), proc)
    slurmd = read_pid_file(pid_file)
    if slurmd is not None and not (is_alive(slurmd, proc) and runs_program(slurmd, slurmd_exe, proc)):
        slurmd = None
    stepds = [
        pid
        for pid in pids_with_open_file(slurmd_log, proc)
        if pid not in me and is_alive(pid, proc) and runs_program(pid, stepd_exe, proc)
    ]
    tasks = [pid for pid in descendants(stepds, proc) if pid not in me and pid not in stepds]
    return NodeProcesses(slurmd=slurmd, stepds=stepds, tasks=tasks)
