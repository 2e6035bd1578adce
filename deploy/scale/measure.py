"""Measuring a scale run from outside the processes: CPU and memory from ``/proc``, Temporal's billable actions
from the dev server's own ``action`` metric (its ``/metrics`` endpoint, ``--metrics-port``).

CPU of a process counts its children that it waited for (``cutime``/``cstime``): the worker's ``squeue``/``sinfo``
runs are the worker's cost. Machine CPU is every core's busy time from ``/proc/stat`` (all processes, the other
tenants of a shared machine included: figures taken under load are noisy).
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProcSampler", "actions_from_metrics", "scrape"]

_TICK = os.sysconf("SC_CLK_TCK")
_ACTION = re.compile(r"^action\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)\s*$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
HEARTBEAT_ACTION = "grpc_RecordActivityTaskHeartbeat"


def actions_from_metrics(text: str, namespace: str) -> dict[str, float]:
    """The server's ``action`` counters of ``namespace`` by ``action_type`` (Prometheus text format)."""
    out: dict[str, float] = {}
    for m in _ACTION.finditer(text):
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("namespace") != namespace:
            continue
        kind = labels.get("action_type", "?")
        out[kind] = out.get(kind, 0.0) + float(m.group("value"))
    return out


def scrape(url: str, timeout_s: float = 60.0, attempts: int = 3) -> str:
    """The server's ``/metrics`` page. It grows with the task queues (a node agent's each): at 1,000 jobs and
    1,240 nodes on a loaded machine one read took longer than 10 s, so allow a minute and ask again."""
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a local URL we built
                body: bytes = response.read()
            return body.decode("utf-8", "replace")
        except (TimeoutError, OSError):
            if attempt == attempts - 1:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def _cpu_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15])  # utime stime cutime cstime


def _ticks_or(pid: int, last: int) -> int:
    now = _cpu_ticks(pid)
    return last if now is None else now


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _machine_busy_ticks() -> tuple[int, int]:
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(x) for x in first]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


@dataclass
class ProcSampler:
    """CPU over a window and peak RSS (sampled every ``sample`` call) of named processes."""

    pids: Mapping[str, int]
    started: float = 0.0
    start_ticks: dict[str, int] = field(default_factory=dict)
    peak_rss: dict[str, float] = field(default_factory=dict)
    last_ticks: dict[str, int] = field(default_factory=dict)
    """The last CPU reading of each process: a process killed in the window counts what it used until then."""
    machine_start: tuple[int, int] = (0, 0)

    def start(self) -> None:
        self.started = time.monotonic()
        self.start_ticks = {name: _cpu_ticks(pid) or 0 for name, pid in self.pids.items()}
        self.machine_start = _machine_busy_ticks()
        self.sample()

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak_rss[name] = max(self.peak_rss.get(name, 0.0), _rss_mb(pid))
            if (ticks := _cpu_ticks(pid)) is not None:
                self.last_ticks[name] = ticks

    def cores(self) -> dict[str, float]:
        """Average cores each process used since ``start`` (and ``machine``: every process on the host)."""
        wall = max(1e-6, time.monotonic() - self.started)
        out = {
            name: round(
                (_ticks_or(pid, self.last_ticks.get(name, self.start_ticks[name])) - self.start_ticks[name])
                / _TICK
                / wall,
                3,
            )
            for name, pid in self.pids.items()
        }
        busy, total = _machine_busy_ticks()
        d_total = max(1, total - self.machine_start[1])
        out["machine"] = round((busy - self.machine_start[0]) / d_total * (os.cpu_count() or 1), 3)
        return out
