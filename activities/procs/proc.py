"""Reading a job's processes from ``/proc``: environment, stat, command line, wait channel.

``scan_job_processes`` walks a proc root (the real ``/proc``, or a fake tree in tests) and returns every process
whose environment says it belongs to the job, with the rank its environment names; ``activities.procs.ranks``
then picks one process per rank. Everything here tolerates the races of a live ``/proc``: a pid that vanishes
between two reads is skipped, an environment that cannot be read is counted (the caller may lack the rights),
and a malformed ``stat`` line is noted, never raised.

Kernel threads and zombies have an empty environment, so they are never part of a job: a rank that already
exited shows up as missing, not as ``Z``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from workflows.domain.procs import MAX_CMDLINE_CHARS

__all__ = [
    "JobProcess",
    "JobScan",
    "ProcStat",
    "boot_time",
    "is_alive",
    "parse_cmdline",
    "parse_environ",
    "parse_stat",
    "scan_job_processes",
]

# Fields after ``(comm)`` in /proc/<pid>/stat, 0-based: proc(5) numbers them from 1 with state as field 3.
_STATE, _PPID, _UTIME, _STIME, _THREADS, _STARTTIME, _RSS = 0, 1, 11, 12, 17, 19, 21

_PYTHON_NAME = re.compile(r"^python\d*(\.\d+)?[a-z]?$")
# PyTorch (2.x) renames the main thread, which renames the process's comm too.
_PYTHON_COMMS = frozenset({"pt_main_thread"})
_MAX_NOTES = 50


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that Rebound uses, in raw kernel units."""

    pid: int
    comm: str
    state: str
    ppid: int
    utime_ticks: int
    stime_ticks: int
    threads: int
    start_ticks: int
    """Start time in clock ticks after boot."""
    rss_pages: int


@dataclass(frozen=True)
class JobProcess:
    """A process whose environment places it in a job, before one process per rank is chosen."""

    stat: ProcStat
    rank: int
    rank_source: str
    local_rank: int | None
    step_id: str
    argv: tuple[str, ...]
    exe: str
    wchan: str
    task: int | None = None
    """``SLURM_PROCID``: the Slurm task the process belongs to (the rank itself under srun per rank)."""
    local_world_size: int | None = None
    """``LOCAL_WORLD_SIZE`` (torchrun, accelerate, DeepSpeed): how many ranks this node's launcher started."""
    world_size: int | None = None
    """``WORLD_SIZE`` when a launcher set it, else ``SLURM_STEP_NUM_TASKS`` for an srun task."""
    layout: tuple[str, str, str] = ("", "", "")
    """The step's layout as srun gave it: ``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE``,
    ``SLURM_DISTRIBUTION`` (each empty when unset)."""

    @property
    def pid(self) -> int:
        """The process id."""
        return self.stat.pid

    @property
    def is_python(self) -> bool:
        """True for a Python interpreter, judged by its executable, its argv[0] or its comm."""
        names = (os.path.basename(self.exe), os.path.basename(self.argv[0]) if self.argv else "")
        return (
            any(_PYTHON_NAME.match(n) for n in names if n)
            or self.stat.comm in _PYTHON_COMMS
            or bool(_PYTHON_NAME.match(self.stat.comm))
        )


@dataclass
class JobScan:
    """What one walk of the proc root found for one job."""

    processes: list[JobProcess] = field(default_factory=list)
    unreadable: int = 0
    """Processes whose environment could not be read: permission denied."""
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """Record why a process was passed over; bounded, so a pathological node cannot flood the result."""
        if len(self.notes) < _MAX_NOTES:
            self.notes.append(text)


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line.

    ``comm`` may contain spaces and parentheses (``(my (odd) name)``): it spans from the first ``(`` to the
    *last* ``)``, the only split that is unambiguous.

    Raises:
        ValueError: The line is malformed (missing parentheses, too few fields, a field that is not a number).
    """
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError(f"no '(comm)' in stat line {text[:80]!r}")
    rest = text[close_at + 1 :].split()
    if len(rest) <= _RSS:
        raise ValueError(f"stat line has {len(rest)} fields after comm, need {_RSS + 1}")
    try:
        return ProcStat(
            pid=int(text[:open_at]),
            comm=text[open_at + 1 : close_at],
            state=rest[_STATE],
            ppid=int(rest[_PPID]),
            utime_ticks=int(rest[_UTIME]),
            stime_ticks=int(rest[_STIME]),
            threads=int(rest[_THREADS]),
            start_ticks=int(rest[_STARTTIME]),
            rss_pages=max(0, int(rest[_RSS])),
        )
    except ValueError as e:
        raise ValueError(f"stat line with a non-numeric field: {e}") from None


def parse_environ(data: bytes) -> dict[str, str]:
    """Parse ``/proc/<pid>/environ`` (NUL-separated ``KEY=value``); entries without ``=`` are ignored."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def parse_cmdline(data: bytes) -> tuple[str, ...]:
    """Parse ``/proc/<pid>/cmdline`` (NUL-separated, NUL-terminated) into argv."""
    if not data:
        return ()
    return tuple(part.decode(errors="replace") for part in data.rstrip(b"\0").split(b"\0"))


def bounded_cmdline(argv: tuple[str, ...]) -> str:
    """argv joined by spaces, cut to ``MAX_CMDLINE_CHARS`` with a visible marker."""
    text = " ".join(argv)
    if len(text) <= MAX_CMDLINE_CHARS:
        return text
    marker = " ..."
    return text[: MAX_CMDLINE_CHARS - len(marker)] + marker


def boot_time(proc_root: Path) -> float | None:
    """Boot time in seconds since the epoch (``btime`` of ``<root>/stat``); None if unreadable."""
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def started_at(stat: ProcStat, btime: float | None, clk_tck: int) -> datetime | None:
    """When the process started, from its start ticks and the boot time."""
    if btime is None:
        return None
    return datetime.fromtimestamp(btime + stat.start_ticks / clk_tck, tz=UTC)


def is_alive(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """True while ``pid`` exists and has not exited (a zombie counts as gone: its stack cannot be read)."""
    try:
        return parse_stat((proc_root / str(pid) / "stat").read_text(errors="replace")).state not in ("Z", "X", "x")
    except (OSError, ValueError):
        return False


def _int_env(env: dict[str, str], key: str, pid: int, scan: JobScan) -> int | None:
    raw = env.get(key)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        scan.note(f"pid {pid}: {key}={raw[:40]!r} is not a number; ignored")
        return None


def _read_optional(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def scan_job_processes(
    job_id: int,
    proc_root: Path = Path("/proc"),
    *,
    exclude: frozenset[int] = frozenset(),
    node: str = "",
    cluster: str = "",
) -> JobScan:
    """Every process under ``proc_root`` whose environment has ``SLURM_JOB_ID == job_id`` and names a rank.

    The rank is ``RANK`` when set (torchrun's workers), else ``SLURM_PROCID`` (srun's tasks); processes with
    neither are skipped. ``exclude`` holds pids never to report (the agent itself). A job id names a job only
    within one cluster, and several slurmds may share a host (the lab; containers): with ``node``/``cluster``
    given, a process whose ``SLURMD_NODENAME``/``SLURM_CLUSTER_NAME`` says otherwise is another node's.

    Raises:
        OSError: ``proc_root`` itself cannot be listed.
    """
    scan = JobScan()
    wanted = str(job_id)
    with os.scandir(proc_root) as entries:
        pids = sorted(int(e.name) for e in entries if e.name.isdigit())
    for pid in pids:
        if pid in exclude:
            continue
        base = proc_root / str(pid)
        try:
            environ = (base / "environ").read_bytes()
        except PermissionError:
            scan.unreadable += 1
            continue
        except OSError:  # vanished (ENOENT, ESRCH) or not a process directory after all
            continue
        env = parse_environ(environ)
        if env.get("SLURM_JOB_ID", env.get("SLURM_JOBID")) != wanted:
            continue
        if (node and env.get("SLURMD_NODENAME", node) != node) or (
            cluster and env.get("SLURM_CLUSTER_NAME", cluster) != cluster
        ):
            continue
        rank, source = _int_env(env, "RANK", pid, scan), "RANK"
        if rank is None:
            rank, source = _int_env(env, "SLURM_PROCID", pid, scan), "SLURM_PROCID"
        if rank is None:
            continue
        local_rank = _int_env(env, "LOCAL_RANK", pid, scan)
        if local_rank is None:
            local_rank = _int_env(env, "SLURM_LOCALID", pid, scan)
        try:
            stat = parse_stat((base / "stat").read_text(errors="replace"))
        except ValueError as e:
            scan.note(f"pid {pid}: malformed stat ({e}); skipped")
            continue
        except OSError:  # exited since its environment was read
            continue
        try:
            exe = os.readlink(base / "exe")
        except OSError:
            exe = ""
        wchan = _read_optional(base / "wchan").decode(errors="replace").strip()
        task = _int_env(env, "SLURM_PROCID", pid, scan)
        world_size = _int_env(env, "WORLD_SIZE", pid, scan) if source == "RANK" else None
        if world_size is None and source == "SLURM_PROCID":
            world_size = _int_env(env, "SLURM_STEP_NUM_TASKS", pid, scan)
        scan.processes.append(
            JobProcess(
                stat=stat,
                rank=rank,
                rank_source=source,
                local_rank=local_rank,
                step_id=env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")),
                argv=parse_cmdline(_read_optional(base / "cmdline")),
                exe=exe,
                wchan="" if wchan == "0" else wchan,
                task=task,
                local_world_size=_int_env(env, "LOCAL_WORLD_SIZE", pid, scan) if source == "RANK" else None,
                world_size=world_size,
                layout=(
                    env.get("SLURM_STEP_NODELIST", ""),
                    env.get("SLURM_STEP_TASKS_PER_NODE", ""),
                    env.get("SLURM_DISTRIBUTION", ""),
                ),
            )
        )
    return scan
