"""The runs of ``rebound bench sources`` against the lab (I/O); scoring and the report are ``deploy.bench.sources``.

Each run: lab clean, the demo job submitted with the opt-in comment, trained past ``warmup_steps`` with a
checkpoint, one fault through one source into the rank ``pick_target`` names (the lowest rank off the batch host)
or its node, the workflow polled until it recorded an incident (DCGM: attributed it), then the workflow stopped,
the job cancelled and what the fault broke repaired. The recovery bench's waits and lab preparation are reused
(``deploy.bench.context``, ``deploy.bench.runner.wait_training``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.bench.context import ENDED_STATES, BenchContext, BenchError, BenchOptions, say, until, write_json_report
from deploy.bench.runner import wait_training
from deploy.bench.scenarios import XID, pick_target
from deploy.bench.sources import (
    Source,
    SourceRun,
    format_sources_table,
    is_detected,
    parse_sources,
    score_source_run,
    sources_report,
)
from workflows.domain.recovery import JobRecoveryStatus

if TYPE_CHECKING:
    from types import ModuleType

    from deploy.demo.common import RankInfo
    from deploy.local.lab import Lab
    from workers.settings import Settings

__all__ = ["run_source", "run_sources"]

DBE_ERRORS = 2
"""Double-bit volatile ECC errors the DCGM page shows on the target GPU (any is a failed GPU)."""
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _exporter() -> ModuleType:
    """The tests' stand-in dcgm-exporter (``tests/gpu/exporter.py``: the server and the page builder the DCGM
    end-to-end test uses, one copy of each). The lab runs from a checkout, but the ``rebound`` script does not put
    the checkout on ``sys.path``, so its root is added for this import."""
    if str(_REPO_ROOT) not in sys.path:
        sys.path.append(str(_REPO_ROOT))
    return importlib.import_module("tests.gpu.exporter")


@contextlib.contextmanager
def _dcgm_settings(config: Path, template: str, node: str) -> Iterator[None]:
    """Name ``node``'s exporter in the lab's settings file (the worker re-reads it at each DCGM read); put it back."""
    before = config.read_text()
    config.write_text(f'{before.rstrip()}\n\n[gpu]\ndcgm_url_template = "{template}"\ndcgm_nodes = ["{node}"]\n')
    try:
        yield
    finally:
        config.write_text(before)


async def _dcgm_page(ctx: BenchContext, target: RankInfo) -> str:
    """A dcgm-exporter page for the target's node, its own GPUs (as its agent reads them), DBE errors on the
    target's GPU."""
    from workers.nodes_cli import read_node_gpus

    read = await read_node_gpus(ctx.settings, target.node)
    if read.report is None or not read.report.samples:
        raise BenchError(f"no GPU read from {target.node}'s agent: {read.error}")
    gpus = [(s.index, s.uuid, s.pci_bus_id) for s in read.report.samples]
    faults = {target.gpu: {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": DBE_ERRORS}}
    return str(_exporter().exporter_page(target.node, gpus, faults))


def _inject(ctx: BenchContext, source: Source, run: str, target: RankInfo) -> datetime:
    """Break ``target`` (or its node) through ``source`` only; the fault's onset."""
    from deploy.demo.inject import inject
    from deploy.local.kernel_log import append_kernel_line, xid_line

    layout = ctx.lab.cfg.layout
    if source == "kernel":
        line = xid_line(target.node, target.gpu, XID)
        t0 = datetime.now(UTC)
        append_kernel_line(layout.kernel_log(target.node), line)
        return t0
    if source == "nvml":
        return inject(layout, "xid", run=run, rank=target.rank, xid=XID).t0
    if source == "scheduler":
        return inject(layout, "node-crash", run=run, node=target.node, frozen_tasks=True).t0
    return inject(layout, "crash", run=run, rank=target.rank).t0  # logs; dcgm (the page is up already)


async def _wait_detected(
    ctx: BenchContext, source: Source, job_id: int, before: set[int]
) -> tuple[JobRecoveryStatus | None, bool]:
    """Poll the workflow until the run has its measure; the last status and whether time ran out."""
    deadline = time.monotonic() + ctx.opts.run_timeout_s
    last: JobRecoveryStatus | None = None
    while time.monotonic() < deadline:
        status = await ctx.status(job_id)
        if status is not None:
            last = status
            if is_detected(source, status, before):
                return status, False
        await asyncio.sleep(ctx.opts.poll_s)
    return last, True


async def _fault_and_wait(
    ctx: BenchContext, source: Source, run: str, job_id: int, target: RankInfo, before: set[int]
) -> tuple[datetime, JobRecoveryStatus | None, bool]:
    if source != "dcgm":
        t0 = await asyncio.to_thread(_inject, ctx, source, run, target)
        return (t0, *await _wait_detected(ctx, source, job_id, before))
    page = await _dcgm_page(ctx, target)
    with _exporter().running_exporter() as exporter:
        exporter.state.pages[f"/{target.node}/metrics"] = page.encode()
        template = exporter.url.replace("/metrics", "/{node}/metrics")
        with _dcgm_settings(ctx.lab.cfg.layout.rebound_config, template, target.node):
            t0 = await asyncio.to_thread(_inject, ctx, source, run, target)
            return (t0, *await _wait_detected(ctx, source, job_id, before))


async def _cleanup(ctx: BenchContext, job_id: int | None, source: Source, node: str | None) -> None:
    """Stop the workflow, cancel the job, repair what the fault broke, every node idle again."""
    from temporalio.service import RPCError

    from activities.temporal.rebound_workflows import terminate_job_recovery
    from deploy.local.processes import LabError

    if job_id is not None:
        with contextlib.suppress(RPCError):  # already closed
            await terminate_job_recovery(ctx.client, ctx.settings.cluster_name, job_id, "rebound bench: measured")
        try:
            ctx.slurm("scancel", str(job_id))
        except LabError as e:
            say(f"scancel {job_id}: {e}")

        async def gone() -> bool:
            return ctx.job_state(job_id) in ENDED_STATES

        await until(f"job {job_id} gone", 60.0, 0.5, gone)
    if source == "nvml" and node is not None:
        ctx.lab.rebound.reset_gpus(node)
    await ctx.prepare_lab(crashed_node=node if source == "scheduler" else None)


async def run_source(ctx: BenchContext, source: Source, index: int, stamp: str) -> SourceRun:
    """One measured run, the lab cleaned after it whatever happened."""
    from deploy.demo.injections import InjectionError, live_ranks
    from deploy.demo.submit import SubmitError, submit_demo
    from deploy.local.processes import LabError

    run = f"bench-src-{source}-{stamp}-{index}"
    layout = ctx.lab.cfg.layout
    started = time.monotonic()
    job_id: int | None = None
    node: str | None = None
    try:
        await ctx.prepare_lab()
        job_id = jid = submit_demo(layout, run, steps=100_000, env=ctx.lab.slurm.env(), opt_in=True)
        say(f"{source} #{index}: submitted job {jid} (run {run})")

        async def monitored() -> bool:
            return await ctx.status(jid) is not None

        await until(f"job {jid}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        await wait_training(ctx, layout.run_dir(run), jid)
        pre = await ctx.status(jid)
        before = {i.number for i in pre.incidents} if pre is not None else set()
        target = pick_target(live_ranks(layout, run))
        node = target.node
        t0, status, timed_out = await _fault_and_wait(ctx, source, run, jid, target, before)
        say(f"{source} #{index}: injected on {node} (rank {target.rank}, GPU {target.gpu}) at {t0:%T.%f}")
        result = score_source_run(
            source=source,
            index=index,
            run=run,
            job_id=jid,
            node=node,
            t0=t0,
            status=status,
            before=before,
            timed_out=timed_out,
            wall_s=time.monotonic() - started,
        )
    except (BenchError, InjectionError, SubmitError, LabError, ValueError, OSError) as e:
        result = SourceRun(
            source=source,
            index=index,
            run=run,
            job_id=job_id,
            node=node,
            failed=True,
            error=f"{type(e).__name__}: {e}",
            wall_s=round(time.monotonic() - started, 1),
        )
    say(
        f"{source} #{index}: job {job_id} {'FAILED (' + result.error + ')' if result.failed else 'ok'}: "
        f"{result.anomaly or '-'} via {','.join(result.event_sources) or result.basis or '-'} "
        f"latency={result.latency_s}s detected={result.detected_s}s recorded={result.recorded_s}s "
        f"verdict={result.verdict_s}s"
    )
    try:
        await _cleanup(ctx, job_id, source, node)
    except (BenchError, LabError) as e:
        say(f"{source} #{index}: cleaning the lab failed: {e}")
    return result


async def run_sources(lab: Lab, settings: Settings, opts: BenchOptions, sources: tuple[Source, ...]) -> list[SourceRun]:
    """Every source ``opts.repeat`` times, source after source (the lab brought up first: Temporal is part of it)."""
    from workers.client import connect

    await asyncio.to_thread(lab.up, log=False)
    ctx = BenchContext(lab=lab, client=await connect(settings.temporal), settings=settings, opts=opts)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[SourceRun] = []
    for source in sources:
        for index in range(1, opts.repeat + 1):
            results.append(await run_source(ctx, source, index, stamp))
    return results


# ----- command ----------------------------------------------------------------------------------------------------


def run_sources_command(args: argparse.Namespace) -> int:
    """``rebound bench sources``: run, print the table, write the JSON; exit 1 when a run failed."""
    from deploy.local.config import LabConfig
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab

    try:
        sources = parse_sources(args.sources)
        opts = BenchOptions(repeat=args.repeat, run_timeout_s=args.timeout, warmup_steps=args.warmup_steps)
    except ValueError as e:  # pydantic's ValidationError is one
        print(f"rebound bench sources: {e}", file=sys.stderr)
        return 2
    lab = Lab(LabConfig())
    started = time.monotonic()
    runs = asyncio.run(run_sources(lab, lab_settings(lab), opts, sources))
    report = sources_report(runs, sources)
    print(format_sources_table(report))
    for name, s in report["sources"].items():
        for err in s["errors"]:
            print(f"{name} {err}")
    print(f"\n{len(runs)} runs in {time.monotonic() - started:.0f} s")
    if args.json is not None:
        write_json_report(args.json, report)
    return 1 if any(r.failed for r in runs) else 0
