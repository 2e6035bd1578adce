"""The cluster-sized costs of one worker, measured on generated Slurm output (``workers.bench.synthetic_slurm``).

``python -m workers.bench.costs [--jobs 1000,5000,10000] [--json PATH]`` prints, per cluster size:

* ``lookup_us``: one ``ClusterSnapshot.job()`` plus one ``.node()`` lookup (every watched job does both per poll);
  ``first_lookup_ms``: the first such pair on a fresh snapshot;
* ``parse_s``: one ``SnapshotCache.get()`` through the real CLI adapter, whose ``squeue``/``sinfo`` print the
  generated documents: reading and parsing both into a ``ClusterSnapshot``;
* ``loop_lag_max_s``: the longest the worker's event loop was kept from running anything else meanwhile (what
  every heartbeat and every other job's poll waits for);
* ``fleet_view_bytes``: the payload the Fleet's view activity returns into the Fleet's history for one isolation
  request (Temporal refuses payloads over 2 MB).

Nothing here needs Slurm or Temporal; the figures are in ``docs/benchmarks/scale-costs.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.snapshots import SnapshotCache
from workers.bench.synthetic_slurm import node_name, sinfo_document, squeue_document
from workflows.domain.slurm import ClusterSnapshot

__all__ = ["generated_scheduler", "measure", "measure_loop_lag"]


def generated_scheduler(jobs: int, directory: Path) -> SlurmCliScheduler:
    """The real CLI adapter over ``squeue``/``sinfo`` stand-ins in ``directory`` that print generated documents
    of ``jobs`` jobs on 90 % as many nodes (the commands' own cost is a ``cat``; the parse is the real one)."""
    directory.mkdir(parents=True, exist_ok=True)
    documents = {"squeue": squeue_document(jobs), "sinfo": sinfo_document(max(1, jobs - jobs // 10))}
    for tool, document in documents.items():
        data = directory / f"{tool}.json"
        data.write_bytes(document)
        script = directory / tool
        script.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(data))}\n")
        script.chmod(0o755)
    return SlurmCliScheduler(env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, bin_dir=directory)


async def measure_loop_lag(work: Callable[[], Awaitable[object]], *, tick_s: float = 0.005) -> tuple[float, float]:
    """(seconds ``work`` took, the longest a ``tick_s`` timer beside it fired late): the event loop's blocking."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(tick_s)
            worst = max(worst, time.perf_counter() - before - tick_s)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(tick_s)  # the ticker is running before the work starts
    started = time.perf_counter()
    await work()
    took = time.perf_counter() - started
    done = True
    await task
    return took, worst


def _lookups(snap: ClusterSnapshot, rounds: int = 200) -> tuple[float, float]:
    """(ms of the first ``job()`` + ``node()`` of a fresh snapshot, µs of each later pair)."""
    ids = [snap.jobs[(i * 7919) % len(snap.jobs)].job_id for i in range(rounds)]
    names = [node_name((i * 7919) % len(snap.nodes)) for i in range(rounds)]
    started = time.perf_counter()
    snap.job(ids[0]), snap.node(names[0])  # the first lookup may build an index
    first = time.perf_counter() - started
    started = time.perf_counter()
    for job_id, name in zip(ids, names, strict=True):
        snap.job(job_id)
        snap.node(name)
    return first * 1e3, (time.perf_counter() - started) / rounds * 1e6


async def _measure_one(jobs: int, directory: Path) -> dict[str, object]:
    reads = generated_scheduler(jobs, directory)
    cache = SnapshotCache(reads, max_age_s=0)
    took, lag = await measure_loop_lag(cache.get)
    snap = await cache.get()
    first_ms, lookup_us = _lookups(snap)
    return {
        "jobs": jobs,
        "nodes": len(snap.nodes),
        "squeue_mb": round((directory / "squeue.json").stat().st_size / 1e6, 1),
        "sinfo_mb": round((directory / "sinfo.json").stat().st_size / 1e6, 1),
        "parse_s": round(took, 3),
        "loop_lag_max_s": round(lag, 3),
        "first_lookup_ms": round(first_ms, 2),
        "lookup_us": round(lookup_us, 2),
    }


def measure(sizes: list[int]) -> list[dict[str, object]]:
    """One row of figures per cluster size."""
    with tempfile.TemporaryDirectory(prefix="rebound-costs-") as tmp:
        return [asyncio.run(_measure_one(n, Path(tmp) / str(n))) for n in sizes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.bench.costs", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="1000,5000,10000", help="comma-separated cluster sizes (jobs)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = measure([int(n) for n in args.jobs.split(",") if n.strip()])
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
