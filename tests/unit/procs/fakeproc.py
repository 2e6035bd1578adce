"""A fake ``/proc`` tree on disk, with the files the rank reader reads, in the kernel's formats."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

BTIME = 1_700_000_000
CLK_TCK = 100
PAGE_SIZE = 4096


def stat_line(
    pid: int,
    comm: str,
    state: str = "S",
    ppid: int = 1,
    utime: int = 0,
    stime: int = 0,
    threads: int = 1,
    start: int = 0,
    rss: int = 0,
) -> str:
    """A 52-field stat line as Linux 5.x+ writes it (fields that the reader ignores are zeros)."""
    fields = ["0"] * 50  # fields 3..52
    fields[0], fields[1] = state, str(ppid)
    fields[11], fields[12] = str(utime), str(stime)
    fields[17], fields[19], fields[21] = str(threads), str(start), str(rss)
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def slurm_env(job_id: int, procid: int, localid: int | None = None, step: str = "0", **extra: str) -> dict[str, str]:
    """The environment srun gives a task (the subset the reader uses, plus noise)."""
    env = {
        "PATH": "/usr/bin",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid if localid is None else localid),
        "SLURM_STEP_ID": step,
    }
    env.update(extra)
    return env


@dataclass
class FakeProc:
    """Builder of a fake proc root: ``add`` writes one process directory."""

    root: Path

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\nprocesses 9\n")
        (self.root / "self").mkdir(exist_ok=True)  # non-numeric entries exist in the real /proc too

    def add(
        self,
        pid: int,
        *,
        env: dict[str, str] | None,
        argv: tuple[str, ...] = ("/usr/bin/python3", "train.py"),
        comm: str = "python3",
        exe: str | None = "/usr/bin/python3.11",
        wchan: str = "futex_wait_queue",
        stat: str | None = None,
        state: str = "S",
        ppid: int = 1,
        utime: int = 0,
        stime: int = 0,
        threads: int = 1,
        start: int = 0,
        rss: int = 0,
    ) -> Path:
        """Write ``<root>/<pid>/{stat,environ,cmdline,wchan,exe}``; ``env=None`` writes an empty environ."""
        d = self.root / str(pid)
        d.mkdir()
        line = stat if stat is not None else stat_line(pid, comm, state, ppid, utime, stime, threads, start, rss)
        (d / "stat").write_text(line)
        environ = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items())
        (d / "environ").write_bytes(environ)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "wchan").write_text(wchan)
        if exe is not None:
            os.symlink(exe, d / "exe")
        return d
