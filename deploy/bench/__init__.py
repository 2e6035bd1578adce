"""The benchmarks that run against the local lab: ``rebound bench recovery`` (``deploy.bench.recovery``),
``rebound bench healthy`` (``deploy.bench.healthy``), ``rebound bench sources`` (``deploy.bench.sources``:
per-source detection latency), ``rebound bench chaos`` (``deploy.bench.chaos``: the
chaos tests with long outages), ``rebound bench launchers`` (``deploy.bench.launchers``) and
``rebound bench scale`` (``deploy.scale``: a synthetic cluster, no lab); ``rebound bench slurm-scale``
(``deploy.bench.slurm_scale``) runs the real Slurm at size on a lab of its own.

They plug into the ``rebound`` CLI through the ``rebound.cli`` entry point ``bench-lab`` (``workers.cli_plugins``),
beside the benchmarks that need no lab (``rebound bench detection|attribution``, in ``workers.bench``). Only the
argument parsers live here, so that ``rebound --help`` stays fast: a benchmark imports the lab, Temporal and the
workflows when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workers.cli_plugins import Commands

__all__ = ["register"]


def _run_recovery(args: argparse.Namespace) -> int:
    from deploy.bench.recovery import run_bench_command

    return run_bench_command(args)


def _run_healthy(args: argparse.Namespace) -> int:
    from deploy.bench.healthy import run_healthy_command

    return run_healthy_command(args)


def _run_launchers(args: argparse.Namespace) -> int:
    from deploy.bench.launchers_run import run_launchers_command

    return run_launchers_command(args)


def _run_slurm_scale(args: argparse.Namespace) -> int:
    from deploy.bench.scale_report import run_slurm_scale_command

    return run_slurm_scale_command(args)


def _run_sources(args: argparse.Namespace) -> int:
    from deploy.bench.sources_run import run_sources_command

    return run_sources_command(args)


def _run_chaos(args: argparse.Namespace) -> int:
    from deploy.bench.chaos import run_chaos_command

    return run_chaos_command(args)


def _run_scale(args: argparse.Namespace) -> int:
    from deploy.scale.run import run_scale_command

    return run_scale_command(args)


def register(commands: Commands) -> None:
    """Add ``bench recovery [--scenarios LIST] [--repeat N] [--json PATH] ...`` and
    ``bench healthy [--minutes M] [--json PATH]``."""
    rec = commands.benchmark(
        "recovery",
        _run_recovery,
        help="inject real faults into the demo job and measure detection, recovery action, resume, lost work",
    )
    rec.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated: rank-crash,node-crash,xid,user-bug (default: all of them, in that order)",
    )
    rec.add_argument("--repeat", type=int, default=3, help="runs per scenario (default 3)")
    rec.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    rec.add_argument("--timeout", type=float, default=180.0, help="seconds from the fault to an outcome, per run")
    rec.add_argument("--warmup-steps", type=int, default=30, help="inject once rank 0 trained this many steps")
    src = commands.benchmark(
        "sources",
        _run_sources,
        help="per-source detection latency on the lab: one fault through the kernel log, NVML, DCGM, the "
        "scheduler or the job's log each, p50/p99 from the fault to Rebound's record",
    )
    src.add_argument(
        "--sources", default=None, help="comma-separated: kernel,nvml,dcgm,scheduler,logs (default all, that order)"
    )
    src.add_argument("--repeat", type=int, default=3, help="runs per source (default 3)")
    src.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    src.add_argument("--timeout", type=float, default=90.0, help="seconds from the fault to the measure, per run")
    src.add_argument("--warmup-steps", type=int, default=10, help="inject once rank 0 trained this many steps")
    healthy = commands.benchmark(
        "healthy",
        _run_healthy,
        help="the false-positive run: a healthy demo job trains on the lab for N minutes; every incident is false",
    )
    healthy.add_argument("--minutes", type=float, default=10.0, help="how long the healthy job trains (default 10)")
    healthy.add_argument("--json", type=Path, default=None, help="also write the result as JSON to this path")
    launchers = commands.benchmark(
        "launchers",
        _run_launchers,
        help="one lab job per launcher (srun, torchrun, lightning, hf) through node crash, XID, rank kill, hang",
    )
    launchers.add_argument(
        "--launchers", default=None, help="comma-separated: srun,torchrun,lightning,hf (default all)"
    )
    launchers.add_argument(
        "--faults", default=None, help="comma-separated: node-crash,xid,rank-kill,hang (default all)"
    )
    launchers.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    launchers.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        help="seconds from a fault to its resume (the 4th restart of a job waits 120 s of backoff first)",
    )
    launchers.add_argument(
        "--lab-nodes",
        type=int,
        default=5,
        help="lab nodes (default 5: a 2-node job keeps its exclusions across faults, so it needs spare nodes)",
    )
    chaos = commands.benchmark(
        "chaos",
        _run_chaos,
        help="the chaos tests on the test lab with long outages: slurmctld, a node agent, Temporal down; a drain storm",
    )
    chaos.add_argument("--outage", type=float, default=60.0, help="seconds each part stays down (default 60)")
    chaos.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated: ctld-watch,ctld-crash,ctld-drain,agent-kill,temporal,storm (default all)",
    )
    chaos.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    scale = commands.benchmark(
        "scale",
        _run_scale,
        help="a synthetic cluster of N jobs against the real worker, agents and Temporal: costs and latencies",
    )
    scale.add_argument("--jobs", default="100", help="comma-separated job counts, one run each (default 100)")
    scale.add_argument("--ranks", type=int, default=8, help="ranks (log files, GPUs) per job (default 8)")
    scale.add_argument("--minutes", type=float, default=10.0, help="measurement window per run (default 10)")
    scale.add_argument(
        "--faults", type=int, default=None, help="faults per kind (default: 100 at 5,000 jobs, one per 50 jobs, >= 5)"
    )
    scale.add_argument(
        "--settle", type=float, default=180.0, help="seconds after the window for the last faults' recoveries"
    )
    scale.add_argument(
        "--push-poll-s", type=float, default=0.1, help="how often each fake node looks for GPU events (agent default)"
    )
    scale.add_argument("--log-budget-mb", type=int, default=4096, help="most job-log bytes written to /dev/shm")
    scale.add_argument("--workers", type=int, default=1, help="Rebound worker processes sharing the jobs (default 1)")
    scale.add_argument(
        "--kill-worker-at",
        type=float,
        default=None,
        metavar="FRACTION",
        help="SIGKILL worker 0 this far into the window (0..1) and measure the takeover (needs --workers >= 2)",
    )
    scale.add_argument(
        "--feed",
        choices=("local", "shared"),
        default=None,
        help="watch.scheduler_feed for the workers (default: the production default)",
    )
    scale.add_argument("--keep", action="store_true", help="keep the run's process logs and Temporal database")
    scale.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    slurm = commands.benchmark(
        "slurm-scale",
        _run_slurm_scale,
        help="real Slurm at size: a lab of N slurmd runs M small opted-in jobs; squeue/sinfo --json cost, watches, "
        "detection of killed jobs and an XID",
    )
    slurm.add_argument("--nodes", type=int, default=64, help="slurmd daemons (default 64, the most the lab runs)")
    slurm.add_argument("--jobs", type=int, default=1000, help="small opted-in jobs, one CPU each (default 1000)")
    slurm.add_argument("--samples", type=int, default=5, help="runs of each of squeue/sinfo --json (default 5)")
    slurm.add_argument("--kills", type=int, default=3, help="jobs killed among the watched, and again among the rest")
    slurm.add_argument("--xid-nodes", type=int, default=1, help="nodes whose fake GPU raises XID 79 (default 1)")
    slurm.add_argument("--window", type=float, default=60.0, help="seconds over which CPU is averaged (default 60)")
    slurm.add_argument("--settle", type=float, default=30.0, help="seconds the watches get before they are counted")
    slurm.add_argument("--timeout", type=float, default=120.0, help="seconds each fault round waits for Rebound")
    slurm.add_argument("--keep-state", action="store_true", help="keep the scale lab's state directory afterwards")
    slurm.add_argument(
        "--down", action="store_true", help="only take down a scale lab left running (a killed run) and delete it"
    )
    slurm.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
