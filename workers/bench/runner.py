"""Orchestration of ``rebound bench recovery`` against the lab (I/O).

Each run of a scenario: bring the lab up, submit the demo job with the opt-in comment (ClusterWatch starts its
JobRecovery workflow), wait until it trains past ``warmup_steps`` with a checkpoint saved, inject the fault with
a known ground truth, poll the workflow's ``status`` query until the incident resumed (or the workflow ended),
score it, then clean the lab for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from workers.bench.labparse import NodeRow, parse_rank_log, parse_sinfo_nodes, rebound_drained
from workers.bench.scenarios import SCENARIOS, XID, GroundTruth, Scenario, ground_truth, pick_target
from workers.bench.scoring import RunResult, is_done, score_run
from workflows.constants import is_rebound_drain
from workflows.domain.base import Frozen
from workflows.domain.recovery import JobRecoveryStatus

if TYPE_CHECKING:
    from temporalio.client import Client

    from deploy.demo.injections import InjectionRecord
    from deploy.local.lab import Lab
    from workers.settings import Settings


class BenchOptions(Frozen):
    scenarios: tuple[Scenario, ...] = SCENARIOS
    repeat: int = Field(3, ge=1, le=100)
    run_timeout_s: float = Field(180.0, gt=0)
    """From the injection to the outcome (resumed, or the workflow ended)."""
    warmup_steps: int = Field(30, ge=1)
    """Inject only once rank 0 logged this step and saved a checkpoint."""
    setup_timeout_s: float = Field(120.0, gt=0)
    """For each wait before the fault: monitored, training, and the lab clean again after a run."""
    poll_s: float = Field(1.0, gt=0)


class BenchError(RuntimeError):
    """A run could not be set up or measured; the message says which step and why."""


@dataclass
class _Ctx:
    lab: Lab
    client: Client
    settings: Settings
    opts: BenchOptions


def _say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _slurm(ctx: _Ctx, *argv: str, timeout: float = 15.0) -> str:
    from deploy.local.processes import run

    return run(list(argv), env=ctx.lab.slurm.env(), timeout=timeout)


def _nodes(ctx: _Ctx) -> list[NodeRow]:
    return parse_sinfo_nodes(_slurm(ctx, "sinfo", "-h", "-N", "-o", "%N|%T|%E"))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def _job_state(ctx: _Ctx, job_id: int) -> str:
    """squeue's state of the job; ``""`` once Slurm no longer lists it."""
    from deploy.local.processes import LabError

    try:
        out = _slurm(ctx, "squeue", "-h", "-j", str(job_id), "-o", "%T").strip()
    except LabError:
        return ""  # "Invalid job id specified": gone
    return out.split()[0] if out else ""


async def _status(ctx: _Ctx, job_id: int) -> JobRecoveryStatus | None:
    """The workflow's status; None while it does not exist yet or does not answer (polling tries again)."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workers.jobs_cli import query_status
    from workflows.domain.errors import ReboundError

    try:
        return await query_status(ctx.client, ctx.settings, job_id)
    except (ReboundError, RPCError, WorkflowQueryFailedError) as e:
        if not isinstance(e, ReboundError):
            _say(f"status query of job {job_id} failed: {e}")
        return None


async def _until(what: str, timeout_s: float, poll_s: float, check: Callable[[], Awaitable[object]]) -> None:
    """Poll the async ``check`` until it returns something truthy.

    Raises:
        BenchError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() >= deadline:
            raise BenchError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


async def prepare_lab(ctx: _Ctx, *, crashed_node: str | None = None) -> None:
    """Lab up (restarts a crashed node's slurmd), Rebound's drains resumed, every node idle."""
    await asyncio.to_thread(ctx.lab.up, log=False)
    _resume_nodes(ctx, crashed_node)
    await _reset_breaker(ctx)

    async def idle() -> bool:
        rows = _nodes(ctx)
        return {r.node for r in rows if r.state == "idle"} >= set(ctx.lab.cfg.node_names)

    try:
        await _until("every lab node idle", ctx.opts.setup_timeout_s, ctx.opts.poll_s, idle)
    except BenchError as e:
        states = ", ".join(f"{r.node}={r.state}{' (' + r.reason + ')' if r.reason else ''}" for r in _nodes(ctx))
        raise BenchError(f"{e}: {states}") from None


async def _reset_breaker(ctx: _Ctx) -> None:
    """Each run starts with a closed breaker, as an operator would reset it after lifting the previous drains."""
    from temporalio.service import RPCError

    from workers.fleet_cli import reset_breaker
    from workflows.domain.errors import ReboundError

    try:
        await reset_breaker(ctx.client, ctx.settings, "lab")
    except (ReboundError, RPCError) as e:  # no Fleet yet (first run): nothing to reset
        _say(f"breaker not reset: {e}")


def _resume_nodes(ctx: _Ctx, crashed_node: str | None) -> None:
    from deploy.local.processes import LabError

    for row in _nodes(ctx):
        if is_rebound_drain(row.reason) or (row.node == crashed_node and row.state != "idle"):
            try:
                _slurm(ctx, "scontrol", "update", f"nodename={row.node}", "state=resume")
                _say(f"resumed {row.node} (was {row.state}: {row.reason or '-'})")
            except LabError as e:
                _say(f"could not resume {row.node}: {e}")


async def _wait_training(ctx: _Ctx, run_dir: Path, job_id: int) -> None:
    log = run_dir / "logs" / f"job-{job_id}-rank-0.log"

    async def trained() -> bool:
        state = _job_state(ctx, job_id)
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise BenchError(f"job {job_id} is {state or 'gone'} before the fault; see {run_dir}/logs")
        attempts = parse_rank_log(_read_lines(log))
        first = attempts[0] if attempts else None
        return bool(first and first.saved_steps and (first.last_step or 0) >= ctx.opts.warmup_steps)

    await _until(f"job {job_id} trained {ctx.opts.warmup_steps} steps", ctx.opts.setup_timeout_s, 0.5, trained)


def _inject(ctx: _Ctx, scenario: Scenario, run: str) -> InjectionRecord:
    from deploy.demo.inject import inject
    from deploy.demo.injections import live_ranks

    layout = ctx.lab.cfg.layout
    target = pick_target(live_ranks(layout, run))
    if scenario == "rank-crash":
        return inject(layout, "crash", run=run, rank=target.rank)
    if scenario == "xid":
        return inject(layout, "gpu-fault", run=run, rank=target.rank, xid=XID)
    if scenario == "node-crash":
        return inject(layout, "node-crash", run=run, node=target.node)
    return inject(layout, "user-bug", run=run, rank="all")


async def _wait_outcome(
    ctx: _Ctx, job_id: int, truth: GroundTruth, before: set[int]
) -> tuple[JobRecoveryStatus | None, bool]:
    """Poll the workflow until the run has an outcome; returns the last status and whether time ran out."""
    deadline = time.monotonic() + ctx.opts.run_timeout_s
    last: JobRecoveryStatus | None = None
    while time.monotonic() < deadline:
        status = await _status(ctx, job_id)
        if status is not None:
            last = status
            if is_done(truth, status, before):
                return status, False
        await asyncio.sleep(ctx.opts.poll_s)
    return last, True


async def _cleanup(ctx: _Ctx, job_id: int | None, scenario: Scenario, record: InjectionRecord | None) -> None:
    """Stop the workflow (so it does not treat the cancel as a failure), cancel the job, repair what the
    fault broke (the GPU state), and leave every node idle."""
    from temporalio.service import RPCError

    from activities.temporal.rebound_workflows import terminate_job_recovery
    from deploy.local.processes import LabError

    if job_id is not None:
        with contextlib.suppress(RPCError):  # already closed: user-bug ends GAVE_UP
            await terminate_job_recovery(ctx.client, ctx.settings.cluster_name, job_id, "rebound bench: run measured")
        try:
            _slurm(ctx, "scancel", str(job_id))
        except LabError as e:
            _say(f"scancel {job_id}: {e}")

        async def gone() -> bool:
            return _job_state(ctx, job_id) in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL")

        await _until(f"job {job_id} gone", 60.0, 0.5, gone)
    node = record.node if record is not None else None
    if scenario == "xid" and node is not None:
        ctx.lab.rebound.reset_gpus(node)
    await prepare_lab(ctx, crashed_node=node if scenario == "node-crash" else None)


async def run_one(ctx: _Ctx, scenario: Scenario, index: int, stamp: str) -> RunResult:
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
        await prepare_lab(ctx)
        job_id = jid = submit_demo(layout, run, steps=100_000, env=ctx.lab.slurm.env(), opt_in=True)
        _say(f"{scenario} #{index}: submitted job {jid} (run {run})")

        async def monitored() -> bool:
            return await _status(ctx, jid) is not None

        await _until(f"job {jid}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        await _wait_training(ctx, layout.run_dir(run), jid)
        pre = await _status(ctx, jid)
        before = {i.number for i in pre.incidents} if pre is not None else set()
        record = await asyncio.to_thread(_inject, ctx, scenario, run)
        truth = ground_truth(scenario, record)
        where = f"rank {record.rank} " if record.rank is not None else ""
        _say(
            f"{scenario} #{index}: injected {record.kind} {where}on {record.node or 'every node'} at {record.t0:%T.%f}"
        )
        status, timed_out = await _wait_outcome(ctx, jid, truth, before)
        logs = layout.run_dir(run) / "logs"
        result = score_run(
            scenario=scenario,
            index=index,
            run=run,
            record=record,
            status=status,
            before=before,
            rebound_drains=rebound_drained(_nodes(ctx), jid),
            rank0_log=_read_lines(logs / f"job-{jid}-rank-0.log"),
            batch_log=_read_lines(logs / f"job-{jid}-batch.log"),
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
    _say(_describe(result))
    try:
        await _cleanup(ctx, job_id, scenario, record)
    except (BenchError, LabError) as e:
        _say(f"{scenario} #{index}: cleaning the lab failed: {e}")
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

    ctx = _Ctx(lab=lab, client=await connect(settings.temporal), settings=settings, opts=opts)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[RunResult] = []
    for scenario in opts.scenarios:
        for index in range(1, opts.repeat + 1):
            results.append(await run_one(ctx, scenario, index, stamp))
    return results
