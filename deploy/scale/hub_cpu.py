"""What one watch hub poll costs per job, without Temporal: ``python -m deploy.scale.hub_cpu --jobs 1000,5000``.

N synthetic jobs, each with R rank log files on tmpfs (``/dev/shm``), in S ``ShardHub`` s (the real hub, the real
``JobWatcher``), polled the way ``watch_shard``'s loop polls them with the ``local`` scheduler feed: one shared
snapshot, every member ``read_all`` then ``settle``. Before each poll every rank's file gets one step line in the
scale benchmark's format (``deploy.scale.logwriter.step_line``), as the benchmark's writer does once a second
(``--lines-every K``: before every K-th poll only, a job stepping slower than the poll interval). Polls
are paced at ``--interval`` (1 s) where they take less, so the every-few-seconds work (globbing) happens as in
production. Per N it reports the hubs' CPU per job per poll (``time.process_time`` around the polls only: the
writing is not counted) after ``--warmup`` polls (64 or more fill each rank's timing rings, as a job running for
minutes has them), the cores that makes at one poll per interval, and the top of a cProfile of the polls.
The garbage collector is set as the worker sets it (``--gc default``: CPython's own settings), and so are quiet polls
(``--full-every``, ``watch.full_poll_every_s``; 0: every poll a full one, as before stop 24).
Every poll must find no result: a healthy job never returns (a finding would be a false incident).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from activities.logs.job_logs import LogPolicy
from activities.logs.watch_hub import ShardHub
from deploy.scale.cluster import opt_in_comment
from deploy.scale.logwriter import rank_file, step_line
from workers.gc_tuning import tune_gc
from workers.settings import WatchSettings
from workflows.domain.loop import JobWatchInput
from workflows.domain.slurm import ClusterSnapshot, JobState, NodeBaseState, SlurmJob, SlurmNode
from workflows.domain.watch_hub import WatchSubscription
from workflows.domain.watch_routing import shard_of

__all__ = ["measure", "main"]

FIRST_JOB = 100_000


def _snapshot(jobs: int, ranks: int, started: datetime) -> ClusterSnapshot:
    made = [
        SlurmJob(
            job_id=FIRST_JOB + i,
            name=f"train-{i}",
            user_id=1000,
            state=JobState.RUNNING,
            nodes=(f"g{i:05d}",),
            node_count=1,
            task_count=ranks,
            start_time=started,
            requeue_allowed=True,
        )
        for i in range(jobs)
    ]
    nodes = [SlurmNode(name=f"g{i:05d}", state=NodeBaseState.ALLOCATED) for i in range(jobs)]
    return ClusterSnapshot(observed_at=started, jobs=tuple(made), nodes=tuple(nodes))


def _write_steps(root: Path, jobs: int, ranks: int, step: int) -> None:
    now = time.time()
    for i in range(jobs):
        for rank in range(ranks):
            with rank_file(root, FIRST_JOB + i, rank).open("a") as f:
                f.write(step_line(rank, ranks, f"g{i:05d}", step, now))


def measure(
    jobs: int,
    *,
    ranks: int,
    shards: int,
    polls: int,
    interval: float,
    root: Path,
    warmup: int = 3,
    lines_every: int = 1,
    full_every: float = 0.0,
) -> dict[str, Any]:
    """Run ``polls`` paced polls of ``jobs`` jobs after ``warmup`` ones; every ``lines_every``-th poll finds a new
    step line per rank (1: every poll; more: the polls between find nothing new, as a job stepping slower than the
    poll interval); ``full_every``: ``watch.full_poll_every_s`` (quiet polls between full ones); the figures
    (module docstring)."""
    shutil.rmtree(root, ignore_errors=True)
    for i in range(jobs):
        (root / f"job-{FIRST_JOB + i}").mkdir(parents=True)
    started = datetime.now(UTC) - timedelta(seconds=5)
    _write_steps(root, jobs, ranks, 0)  # the files exist before the watch starts (read from 0: born in the attempt)
    snap = _snapshot(jobs, ranks, started)
    hubs = [ShardHub(k, LogPolicy(), lease_s=3600, full_poll_every_s=full_every) for k in range(shards)]
    pattern = opt_in_comment(str(root)).removeprefix("rebound: logs=")
    for i in range(jobs):
        job_id = FIRST_JOB + i
        watch = JobWatchInput(job_id=job_id, log_patterns=(pattern,), last_state=JobState.RUNNING)
        sub = WatchSubscription(watch=watch, workflow_id=f"rebound/bench/job/{job_id}", run_id="r", seq=1)
        hubs[shard_of(job_id, shards)].subscribe(sub)
    results = 0
    written = 1
    cpu = 0.0
    profile = cProfile.Profile()
    for n in range(warmup + polls + 1):  # the last poll is profiled, not counted (the profiler slows it)
        began = time.monotonic()
        if (n + 1) % lines_every == 0:
            _write_steps(root, jobs, ranks, n + 1)
            written += 1
        if n == warmup + polls:
            profile.enable()
        c0 = time.process_time()
        for hub in hubs:
            now = datetime.now(UTC)
            for key, step in hub.read_all(snap, now):
                results += hub.settle(key, step, None) is not None
        if warmup <= n < warmup + polls:
            cpu += time.process_time() - c0
        profile.disable()
        time.sleep(max(0.0, interval - (time.monotonic() - began)))
    if full_every > 0:  # one full poll more (not counted), so that every line written is folded before the count
        time.sleep(full_every)
        for hub in hubs:
            for key, step in hub.read_all(snap, datetime.now(UTC)):
                results += hub.settle(key, step, None) is not None
    counted = ignored = 0
    for hub in hubs:
        for member in hub.members.values():
            progress = member.watcher.state.progress
            if progress is not None:
                counted += sum(r.progress_count for r in progress.ranks)
                ignored += progress.ignored
    shutil.rmtree(root, ignore_errors=True)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    per_job_ms = cpu / polls / jobs * 1000
    return {
        "jobs": jobs,
        "ranks": ranks,
        "shards": shards,
        "polls": polls,
        "warmup": warmup,
        "lines_every": lines_every,
        "full_poll_every_s": full_every,
        "cpu_ms_per_job_poll": round(per_job_ms, 4),
        "cores_at_interval": round(per_job_ms * jobs / 1000 / interval, 3),
        "results": results,
        "lines_written": jobs * ranks * written,
        "steps_counted": counted,
        "samples_ignored": ignored,
        "profile": text.getvalue(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.scale.hub_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="1000,5000", help="comma-separated job counts")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--polls", type=int, default=10)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=3, help="polls before the measured ones (64+: full rings)")
    parser.add_argument(
        "--lines-every", type=int, default=1, help="a step line per rank every this many polls (1: every poll)"
    )
    parser.add_argument(
        "--full-every",
        type=float,
        default=WatchSettings.model_fields["full_poll_every_s"].default,
        help="watch.full_poll_every_s: full polls this far apart, quiet ones between (0: every poll full)",
    )
    parser.add_argument("--root", type=Path, default=Path("/dev/shm/rebound-hub-cpu"))
    parser.add_argument("--json", type=Path, default=None, help="write the runs here")
    parser.add_argument("--profile", action="store_true", help="print each run's cProfile top list")
    parser.add_argument(
        "--gc",
        choices=("worker", "default"),
        default="worker",
        help="the worker's garbage-collector settings (workers.gc_tuning), or CPython's defaults",
    )
    args = parser.parse_args(argv)
    if args.gc == "worker":
        tune_gc()
    runs = []
    print(
        f"{'jobs':>6} {'ranks':>5} {'polls':>5} {'ms CPU/job/poll':>16} {'cores @1/interval':>18} {'results':>7} "
        f"{'written':>8} {'counted':>8} {'ignored':>7}"
    )
    for jobs in (int(j) for j in args.jobs.split(",")):
        run = measure(
            jobs,
            ranks=args.ranks,
            shards=args.shards,
            polls=args.polls,
            interval=args.interval,
            root=args.root,
            warmup=args.warmup,
            lines_every=max(1, args.lines_every),
            full_every=args.full_every,
        )
        runs.append(run)
        print(
            f"{jobs:>6} {run['ranks']:>5} {run['polls']:>5} {run['cpu_ms_per_job_poll']:>16.4f} "
            f"{run['cores_at_interval']:>18.3f} {run['results']:>7} "
            f"{run['lines_written']:>8} {run['steps_counted']:>8} {run['samples_ignored']:>7}",
            flush=True,
        )
        if args.profile:
            print(run["profile"])
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
