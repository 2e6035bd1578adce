"""The cluster-sized costs of one worker, measured on generated Slurm output (``workers.bench.synthetic_slurm``).

``python -m workers.bench.costs [--jobs 1000,5000,10000] [--json PATH]`` prints, per cluster size:

* ``lookup_us``: one ``ClusterSnapshot.job()`` plus one ``.node()`` lookup (every watched job does both per poll);
  ``first_lookup_ms``: the first such pair on a fresh snapshot (it builds the index); ``scan_lookup_us``: the
  same pair as a scan of the tuples (how the lookup was done before the index);
* ``parse_s``: one ``SnapshotCache.get()`` through the real CLI adapter, whose ``squeue``/``sinfo`` print the
  generated documents: reading and parsing both into a ``ClusterSnapshot`` (median of 3 polls after a first);
* ``loop_cpu_s``: CPU the event loop's thread spent on one poll; ``loop_step_cpu_max_s``: the most it spent
  without yielding (what every heartbeat and every other job's poll waits for); ``loop_lag_max_s``: the longest a
  5 ms timer beside the polls fired late (wall clock: on a busy machine it includes other processes' turns);
* each size twice: ``offload`` false parses on the event loop (as before ``activities.slurm.parse_offload``),
  true in child processes;
* ``snapshot_payload_bytes``: the whole snapshot as a Temporal payload (what ``fleet_cluster_view`` returned into
  the Fleet's history); ``fleet_view_bytes``: what ``fleet_view`` returns for one isolation request naming 8 nodes,
  with 200 nodes in the Fleet's records (Temporal refuses payloads over 2 MB);

Nothing here needs Slurm or Temporal; the figures are in ``docs/benchmarks/scale-costs.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.snapshots import SnapshotCache
from workers.bench.synthetic_slurm import node_name, sinfo_document, squeue_document
from workflows.domain.fleet import FleetState, IsolationRequest, NodeRecord
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.fleet import build_fleet_view, view_input

__all__ = ["LoopLag", "generated_scheduler", "measure", "measure_loop_lag"]


def generated_scheduler(
    jobs: int, directory: Path, *, offload: bool = True, parser: ParseOffload | None = None
) -> SlurmCliScheduler:
    """The real CLI adapter over ``squeue``/``sinfo`` stand-ins in ``directory`` that print generated documents
    of ``jobs`` jobs on 90 % as many nodes (the commands' own cost is a ``cat``; the parse is the real one);
    ``parser`` replaces the adapter's own ``ParseOffload(enabled=offload)``."""
    directory.mkdir(parents=True, exist_ok=True)
    documents = {"squeue": squeue_document(jobs), "sinfo": sinfo_document(max(1, jobs - jobs // 10))}
    for tool, document in documents.items():
        data = directory / f"{tool}.json"
        data.write_bytes(document)
        script = directory / tool
        script.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(data))}\n")
        script.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return SlurmCliScheduler(
        env=env, bin_dir=directory, timeout_s=120.0, parser=parser or ParseOffload(enabled=offload)
    )


class LoopLag:
    """What a ``tick_s`` timer beside some work saw: the longest it fired late (wall clock: on a busy machine this
    includes time the OS gave to other processes), and the most CPU the event loop's thread spent between two
    ticks (work that held the loop, whatever the machine's load)."""

    def __init__(self) -> None:
        self.took_s = 0.0
        self.max_late_s = 0.0
        self.max_step_cpu_s = 0.0
        self.loop_cpu_s = 0.0


async def measure_loop_lag(work: Callable[[], Awaitable[object]], *, tick_s: float = 0.005) -> LoopLag:
    """How long ``work`` took and how long it kept the event loop from running anything else (``LoopLag``)."""
    lag = LoopLag()
    done = False

    async def ticker() -> None:
        while not done:
            before, cpu_before = time.perf_counter(), time.thread_time()
            await asyncio.sleep(tick_s)
            lag.max_late_s = max(lag.max_late_s, time.perf_counter() - before - tick_s)
            lag.max_step_cpu_s = max(lag.max_step_cpu_s, time.thread_time() - cpu_before)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(tick_s)  # the ticker is running before the work starts
    started, cpu_started = time.perf_counter(), time.thread_time()
    await work()
    lag.took_s, lag.loop_cpu_s = time.perf_counter() - started, time.thread_time() - cpu_started
    done = True
    await task
    return lag


def _fleet_payloads(snap: ClusterSnapshot) -> tuple[int, int]:
    """(bytes of the whole snapshot as a payload, bytes of the Fleet's view for one request) (module docstring)."""
    names = [n.name for n in snap.nodes]
    records = {name: NodeRecord(node=name, since=snap.observed_at) for name in names[:: max(1, len(names) // 200)]}
    req = IsolationRequest(
        request_id="rebound/bench/job/1/incident-1",
        reply_to="rebound/bench/job/1",
        job_id=1,
        partition="gpu",
        incident="1-1",
        cause="rank-killed",
        nodes=tuple(names[:8]),
        requested_at=snap.observed_at,
        node_count=1,
    )
    view = build_fleet_view(snap, view_input(FleetState(cluster="bench", nodes=records), req))
    convert = pydantic_data_converter.payload_converter.to_payloads
    return convert([snap])[0].ByteSize(), convert([view])[0].ByteSize()


def _scan_us(snap: ClusterSnapshot, rounds: int = 50) -> float:
    """µs of a ``job()`` + ``node()`` pair as a scan of the tuples (the lookup before the index)."""
    ids = [snap.jobs[(i * 7919) % len(snap.jobs)].job_id for i in range(rounds)]
    names = [node_name((i * 7919) % len(snap.nodes)) for i in range(rounds)]
    started = time.perf_counter()
    for job_id, name in zip(ids, names, strict=True):
        next((j for j in snap.jobs if j.job_id == job_id), None)
        next((n for n in snap.nodes if n.name == name), None)
    return (time.perf_counter() - started) / rounds * 1e6


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


async def _measure_one(jobs: int, directory: Path, *, offload: bool) -> dict[str, object]:
    reads = generated_scheduler(jobs, directory, offload=offload)
    cache = SnapshotCache(reads, max_age_s=0)
    snap = await cache.get()  # the first poll also starts the parse processes
    polls = [await measure_loop_lag(cache.get) for _ in range(3)]
    first_ms, lookup_us = _lookups(snap)
    snapshot_bytes, view_bytes = _fleet_payloads(snap)
    return {
        "jobs": jobs,
        "nodes": len(snap.nodes),
        "offload": offload,
        "squeue_mb": round((directory / "squeue.json").stat().st_size / 1e6, 1),
        "sinfo_mb": round((directory / "sinfo.json").stat().st_size / 1e6, 1),
        "parse_s": round(statistics.median(p.took_s for p in polls), 3),
        "loop_cpu_s": round(statistics.median(p.loop_cpu_s for p in polls), 3),
        "loop_step_cpu_max_s": round(max(p.max_step_cpu_s for p in polls), 3),
        "loop_lag_max_s": round(max(p.max_late_s for p in polls), 3),
        "scan_lookup_us": round(_scan_us(snap), 1),
        "first_lookup_ms": round(first_ms, 2),
        "lookup_us": round(lookup_us, 2),
        "snapshot_payload_bytes": snapshot_bytes,
        "fleet_view_bytes": view_bytes,
    }


def measure(sizes: list[int], offload: tuple[bool, ...] = (False, True)) -> list[dict[str, object]]:
    """One row of figures per cluster size and parse mode (in-process as before, offloaded)."""
    with tempfile.TemporaryDirectory(prefix="rebound-costs-") as tmp:
        return [asyncio.run(_measure_one(n, Path(tmp) / str(n), offload=mode)) for n in sizes for mode in offload]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.bench.costs", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="1000,5000,10000", help="comma-separated cluster sizes (jobs)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--mode", choices=("both", "inline", "offload"), default="both", help="how to parse")
    args = parser.parse_args(argv)
    modes = {"both": (False, True), "inline": (False,), "offload": (True,)}[args.mode]
    rows = measure([int(n) for n in args.jobs.split(",") if n.strip()], modes)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
