"""Orchestration of ``rebound bench recovery`` against the lab (I/O).

Each run of a scenario: bring the lab up, submit the demo job with the opt-in comment (ClusterWatch starts its
JobRecovery workflow), wait until it trains past ``warmup_steps`` with a checkpoint saved, inject the fault with
a known ground truth, poll the workflow's ``status`` query until the incident resumed (or the workflow ended),
score it, then clean the lab for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.bench.context import (
    ENDED_STATES,
    LIVE_STATES,
    BenchContext,
    BenchError,
    BenchOptions,
    read_lines,
    say,
    until,
)
from deploy.bench.labparse import parse_rank_log, rebound_drained
from deploy.bench.scenarios import GroundTruth, Scenario, ground_truth
from deploy.bench.scoring import RunResult, is_done, score_run
from workflows.domain.recovery import JobRecoveryStatus

if TYPE_CHECKING:
    from deploy.demo.injections import InjectionRecord
    from deploy.local.lab import Lab
    from workers.settings import Settings

__all__ = ["run_benchmark", "run_one", "wait_training"]


async def wait_training(ctx: BenchContext, run_dir: Path, job_id: int) -> None:
    log = run_dir / "logs" / f"job-{job_id}-rank-0.log"

    async def trained() -> bool:
        state = ctx.job_state(job_id)
        if state not in LIVE_STATES:
            raise BenchError(f"job {job_id} is {state or 'gone'} before the fault; see {run_dir}/logs")
        attempts = parse_rank_log(read_lines(log))
        first = attempts[0] if attempts else None
        return bool(first and first.saved_steps and (first.last_step or 0) >= ctx.opts.warmup_steps)

    await until(f"job {job_id} trained {ctx.opts.warmup_steps} steps", ctx.opts.setup_timeout_s, 0.5, trained)


async def _wait_outcome(
    ctx: BenchContext, job_id: int, truth: GroundTruth, before: set[int]
) -> tuple[JobRecoveryStatus | None, bool]:
    """Poll the workflow until the run has an outcome; returns the last status and whether time ran out."""
    deadline = time.monotonic() + ctx.opts.run_timeout_s
    last: JobRecoveryStatus | None = None
    while time.monotonic() < deadline:
        status = await ctx.status(job_id)
        if status is not None:
            last = status
            if is_done(truth, status, before):
                return status, False
        await asyncio.sleep(ctx.opts.poll_s)
    return last, True


async def _cleanup(ctx: BenchContext, job_id: int | None, scenario: Scenario, record: InjectionRecord | None) -> None:
    """Stop the workflow (so it does not treat the cancel as a failure), cancel the job, repair what the
    fault broke (the GPU state), and leave every node idle."""
    from temporalio.service import RPCError

    from activities.temporal.rebound_workflows import terminate_job_recovery
    from deploy.local.processes import LabError

    if job_id is not None:
        with contextlib.suppress(RPCError):  # already closed: user-bug ends GAVE_UP
            await terminate_job_recovery(ctx.client, ctx.settings.cluster_name, job_id, "rebound bench: run measured")
        try:
            ctx.slurm("scancel", str(job_id))
        except LabError as e:
            say(f"scancel {job_id}: {e}")

        async def gone() -> bool:
            return ctx.job_state(job_id) in ENDED_STATES

        await until(f"job {job_id} gone", 60.0, 0.5, gone)
    node = record.node if record is not None else None
    if scenario == "xid" and node is not None:
        ctx.lab.rebound.reset_gpus(node)
    await ctx.prepare_lab(crashed_node=node if scenario == "node-crash" else None)


async def run_one(ctx: BenchContext, scenario: Scenario, index: int, stamp: str) -> RunResult:
    """One measured run, the lab cleaned after it whatever happened."""
    from deploy.demo.injections import InjectionError
    from deploy.demo.submit import SubmitError, submit_demo
    from deploy.local.processes import LabError

    run = f"bench-{scenario}-{stamp}-{index}"
    layout = ctx.lab.cfg.layout
    started = time.monotonic()
    job_id: int | None = None
    record: InjectionRecord | None = None
    try:
        await ctx.prepare_lab()
        job_id = jid = submit_demo(layout, run, steps=100_000, env=ctx.lab.slurm.env(), opt_in=True)
        say(f"{scenario} #{index}: submitted job {jid} (run {run})")

        async def monitored() -> bool:
            return await ctx.status(jid) is not None

        await until(f"job {jid}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        await wait_training(ctx, layout.run_dir(run), jid)
        pre = await ctx.status(jid)
        before = {i.number for i in pre.incidents} if pre is not None else set()
        record = await asyncio.to_thread(ctx.inject, scenario, run)
        truth = ground_truth(scenario, record)
        where = f"rank {record.rank} " if record.rank is not None else ""
        say(f"{scenario} #{index}: injected {record.kind} {where}on {record.node or 'every node'} at {record.t0:%T.%f}")
        status, timed_out = await _wait_outcome(ctx, jid, truth, before)
        logs = layout.run_dir(run) / "logs"
        result = score_run(
            scenario=scenario,
            index=index,
            run=run,
            record=record,
            status=status,
            before=before,
            rebound_drains=rebound_drained(ctx.nodes(), jid),
            rank0_log=read_lines(logs / f"job-{jid}-rank-0.log"),
            batch_log=read_lines(logs / f"job-{jid}-batch.log"),
            timed_out=timed_out,
            wall_s=time.monotonic() - started,
        )
    except (BenchError, InjectionError, SubmitError, LabError, ValueError) as e:
        result = RunResult(
            scenario=scenario,
            index=index,
            run=run,
            job_id=job_id,
            failed=True,
            error=f"{type(e).__name__}: {e}",
            wall_s=round(time.monotonic() - started, 1),
        )
    say(_describe(result))
    try:
        await _cleanup(ctx, job_id, scenario, record)
    except (BenchError, LabError) as e:
        say(f"{scenario} #{index}: cleaning the lab failed: {e}")
    return result


def _describe(r: RunResult) -> str:
    head = f"{r.scenario} #{r.index}: job {r.job_id}"
    if r.failed and r.t0 is None:
        return f"{head} FAILED before the fault: {r.error}"
    verdict = f"FAILED ({r.error})" if r.failed else "ok"
    return (
        f"{head} {verdict}: {r.cause or '-'} nodes={','.join(r.implicated_nodes) or '-'} (truth {r.truth_node or '-'}) "
        f"detection={r.detection_s}s action={r.action_s}s resume={r.resume_s}s lost={r.lost_steps} "
        f"false={r.false_actions}{' ' + '; '.join(r.false_action_details) if r.false_action_details else ''}"
    )


async def run_benchmark(lab: Lab, settings: Settings, opts: BenchOptions) -> list[RunResult]:
    """Every scenario ``opts.repeat`` times, scenario after scenario."""
    from workers.client import connect

    ctx = BenchContext(lab=lab, client=await connect(settings.temporal), settings=settings, opts=opts)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[RunResult] = []
    for scenario in opts.scenarios:
        for index in range(1, opts.repeat + 1):
            results.append(await run_one(ctx, scenario, index, stamp))
    return results
