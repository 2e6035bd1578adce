"""``rebound bench healthy --minutes N``: the false-positive run. A healthy demo job trains on the lab for N minutes
under Rebound's watch; every incident it records (a hang, a straggler, a crash) is a false positive.

The job is the usual demo (2 nodes x 2 ranks, opted in through its comment); nothing is injected. The report
gives the steps trained, the step-time spread the detectors saw, and every incident with its summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from deploy.bench.context import (
    LIVE_STATES,
    BenchContext,
    BenchError,
    BenchOptions,
    read_lines,
    say,
    until,
)
from deploy.bench.labparse import parse_rank_log

__all__ = ["run_healthy", "run_healthy_command"]

_STEP_TIME = "step_time="


async def run_healthy(ctx: BenchContext, minutes: float) -> dict[str, Any]:
    """Train a healthy job for ``minutes`` under Rebound's watch; return what Rebound recorded about it."""
    from temporalio.service import RPCError

    from activities.temporal.rebound_workflows import terminate_job_recovery
    from deploy.demo.submit import submit_demo
    from deploy.local.processes import LabError

    layout = ctx.lab.cfg.layout
    run = f"bench-healthy-{time.strftime('%Y%m%d-%H%M%S')}"
    await ctx.prepare_lab()
    job_id = submit_demo(layout, run, steps=1_000_000, env=ctx.lab.slurm.env(), opt_in=True)
    say(f"healthy: submitted job {job_id} (run {run}); watching it for {minutes:g} min")
    try:

        async def monitored() -> bool:
            return await ctx.status(job_id) is not None

        await until(f"job {job_id}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        deadline = time.monotonic() + minutes * 60
        while time.monotonic() < deadline:
            state = ctx.job_state(job_id)
            if state not in LIVE_STATES:
                raise BenchError(f"job {job_id} is {state or 'gone'} during the healthy run")
            await asyncio.sleep(5)
        status = await ctx.status(job_id)
    finally:
        with contextlib.suppress(RPCError):  # already closed
            await terminate_job_recovery(
                ctx.client, ctx.settings.cluster_name, job_id, "rebound bench healthy: run measured"
            )
        with contextlib.suppress(LabError):
            ctx.slurm("scancel", str(job_id))
    logs = layout.run_dir(run) / "logs"
    rank0 = read_lines(logs / f"job-{job_id}-rank-0.log")
    attempts = parse_rank_log(rank0)
    step_times = [float(line.split(_STEP_TIME, 1)[1].split("s", 1)[0]) for line in rank0 if _STEP_TIME in line]
    incidents = list(status.incidents) if status is not None else []
    return {
        "job_id": job_id,
        "run": run,
        "minutes": minutes,
        "steps": attempts[-1].last_step if attempts else None,
        "restarts": status.restart_count if status is not None else None,
        "step_time_s": {
            "median": statistics.median(step_times) if step_times else None,
            "p99": sorted(step_times)[int(0.99 * (len(step_times) - 1))] if step_times else None,
            "max": max(step_times, default=None),
        },
        "false_positives": len(incidents),
        "incidents": [
            {"kind": i.anomaly.kind.value, "detected_at": i.detected_at.isoformat(), "summary": i.anomaly.summary}
            for i in incidents
        ],
    }


def run_healthy_command(args: argparse.Namespace) -> int:
    """Run it against the local lab; print a table; exit 0 only when nothing was flagged."""
    from deploy.local.config import LabConfig
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab
    from workers.client import connect

    lab = Lab(LabConfig())
    settings = lab_settings(lab)

    async def main() -> dict[str, Any]:
        await asyncio.to_thread(lab.up, log=False)  # Temporal must answer before the client connects
        ctx = BenchContext(lab=lab, client=await connect(settings.temporal), settings=settings, opts=BenchOptions())
        return await run_healthy(ctx, args.minutes)

    try:
        result = asyncio.run(main())
    except BenchError as e:
        print(f"rebound bench healthy: {e}", file=sys.stderr)
        return 1
    st = result["step_time_s"]
    print(f"healthy run: {result['minutes']:g} min, job {result['job_id']}, {result['steps']} steps, "
          f"step time median {st['median']}s p99 {st['p99']}s max {st['max']}s")  # fmt: skip
    print(f"false positives: {result['false_positives']}")
    for inc in result["incidents"]:
        print(f"  {inc['kind']:<10} {inc['detected_at']} {inc['summary'][:160]}")
    if args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["false_positives"] == 0 else 3
