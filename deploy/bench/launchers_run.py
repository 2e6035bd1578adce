"""``rebound bench launchers`` against the lab (I/O): one job per launcher, its faults one after the other.

For each launcher: the lab clean (``BenchContext.prepare_lab``), the job submitted with the opt-in comment; then
for each fault: wait until the job trains (a valid checkpoint newer than the one the previous restart loaded),
inject, poll the workflow until the incident resumed (the latest valid checkpoint is read when Rebound restarts
the job), score (``deploy.bench.launchers.score_fault``), and repair what the fault broke as an operator would
(the crashed node's slurmd, the fake GPU, Rebound's drains lifted, the breaker reset) while the job goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from deploy.bench.context import (
    ENDED_STATES,
    BenchContext,
    BenchError,
    BenchOptions,
    read_lines,
    say,
    until,
)
from deploy.bench.labparse import rebound_drained
from deploy.bench.launchers import (
    FAULTS,
    LAUNCHERS,
    SUBMIT,
    Fault,
    FaultResult,
    Launcher,
    Observed,
    failures,
    format_table,
    parse_names,
    report,
    score_fault,
)
from deploy.bench.scenarios import GroundTruth
from deploy.bench.scoring import incidents_after, is_done
from workflows.domain.base import Frozen
from workflows.domain.checkpoints import CheckpointRef, CheckpointReport, CheckpointStatus
from workflows.domain.recovery import JobRecoveryStatus

if TYPE_CHECKING:
    from deploy.demo.injections import InjectionRecord
    from deploy.local.lab import Lab
    from workers.settings import Settings

__all__ = ["LauncherOptions", "run_launcher", "run_launchers", "run_launchers_command"]


#: One job goes through every fault in turn: four restarts, and room for unplanned ones (the lab's in-place
#: requeues sometimes lose the next attempt to a SIGTERM from Slurm: launchers.md, stop 24), which the bench waits
#: for and which must not spend the budget the faults under test need. Rebound's opt-in cap (``optin_caps``).
RESTART_BUDGET = 10


class LauncherOptions(Frozen):
    launchers: tuple[Launcher, ...]
    faults: tuple[Fault, ...]
    fault_timeout_s: float = Field(150.0, gt=0)
    """From the injection to the resumed incident."""
    train_timeout_s: float = Field(180.0, gt=0)
    """For the job to train (a new valid checkpoint) before each fault: the real trainers import slowly."""


def _scan(run_dir: Path) -> CheckpointReport:
    from activities.checkpoints.scan import scan_checkpoints

    return scan_checkpoints(run_dir / "checkpoints")


def _latest(run_dir: Path) -> CheckpointRef | None:
    return _scan(run_dir).latest_valid


def _valid_steps(found: CheckpointReport | None) -> dict[str, int]:
    if found is None:
        return {}
    return {
        Path(c.path).name: c.step for c in found.checked if c.status is CheckpointStatus.VALID and c.step is not None
    }


def _log_path(layout_run_dir: Path, launcher: Launcher, job_id: int) -> Path:
    if launcher == "torchrun":
        return layout_run_dir / f"slurm-{job_id}.out"
    return layout_run_dir / "logs" / f"job-{job_id}-rank-0.log"


def _excluded(ctx: BenchContext, job_id: int) -> tuple[str, ...]:
    from deploy.local.processes import LabError

    try:
        text = ctx.slurm("scontrol", "show", "job", "-o", str(job_id))
    except LabError:
        return ()
    field = next((w.split("=", 1)[1] for w in text.split() if w.startswith("ExcNodeList=")), "(null)")
    if field in ("", "(null)"):
        return ()
    return tuple(ctx.slurm("scontrol", "show", "hostnames", field).split())


async def _wait_training(ctx: BenchContext, run_dir: Path, job_id: int, after: int | None, timeout_s: float) -> None:
    """Until the job runs and holds a valid checkpoint newer than step ``after`` (the one its restart loaded).

    A job that ends before the fault while its JobRecovery is still at work is waited for: Rebound recovering an
    unplanned failure (seen on the lab: after a requeue in place, slurmstepd SIGTERMs the new attempt's torchrun
    agent seconds after it resumed; ``docs/benchmarks/launchers.md``) is Rebound's job, not the bench's failure.
    Only a job that ended with its JobRecovery finished or given up ends the run."""
    noted: set[str] = set()

    async def trained() -> bool:
        state = ctx.job_state(job_id)
        if state in ENDED_STATES:
            status = await ctx.status(job_id)
            if status is None or status.state.is_terminal():
                recovery = status.state.value if status is not None else "not answering"
                raise BenchError(
                    f"job {job_id} is {state or 'gone'} before the fault (JobRecovery {recovery}); see {run_dir}"
                )
            if state not in noted:
                noted.add(state)
                say(f"job {job_id} is {state or 'gone'} before the fault; JobRecovery {status.state.value}: waiting")
            return False
        ref = await asyncio.to_thread(_latest, run_dir)
        return state == "RUNNING" and ref is not None and ref.step is not None and ref.step > (after or 0)

    await until(f"job {job_id} saved a checkpoint after step {after or 0}", timeout_s, 1.0, trained)


async def _wait_outcome(
    ctx: BenchContext, run_dir: Path, job_id: int, before: set[int], node: str, timeout_s: float
) -> tuple[JobRecoveryStatus | None, CheckpointReport | None, bool]:
    """Poll until an incident after the fault resumed (or the workflow ended). The latest valid checkpoint is read
    once the incident records its restart: the one the restarted job should load."""
    deadline = time.monotonic() + timeout_s
    last: JobRecoveryStatus | None = None
    at_restart: CheckpointReport | None = None
    truth = GroundTruth(node=node, restart=True)
    while time.monotonic() < deadline:
        status = await ctx.status(job_id)
        if status is not None:
            last = status
            restarted = any(i.restarted_at is not None for i in incidents_after(status, before))
            if restarted and at_restart is None:
                at_restart = await asyncio.to_thread(_scan, run_dir)
            if is_done(truth, status, before):
                return status, at_restart, False
        await asyncio.sleep(ctx.opts.poll_s)
    return last, at_restart, True


async def _repair(ctx: BenchContext, fault: Fault, node: str | None) -> None:
    """What an operator does after a fault: the node's slurmd back, the GPU reset, Rebound's drains lifted, the
    breaker closed. The job keeps its own exclusions (Rebound's), so the lab needs spare nodes."""
    if fault == "xid" and node is not None:
        await asyncio.to_thread(ctx.lab.rebound.reset_gpus, node)
    await ctx.restore_nodes(crashed_node=node if fault == "node-crash" else None)


async def _one_fault(
    ctx: BenchContext, opts: LauncherOptions, launcher: Launcher, fault: Fault, run: str, job_id: int, after: int | None
) -> tuple[FaultResult, int | None]:
    """One fault on the running job; returns its result and the checkpoint step the restart loaded."""
    from deploy.demo.injections import InjectionError

    run_dir = ctx.lab.cfg.layout.run_dir(run)
    started = time.monotonic()
    record: InjectionRecord | None = None
    try:
        await _wait_training(ctx, run_dir, job_id, after, opts.train_timeout_s)
        pre = await ctx.status(job_id)
        before = {i.number for i in pre.incidents} if pre is not None else set()
        drained_before = set(rebound_drained(ctx.nodes(), job_id))
        log = _log_path(run_dir, launcher, job_id)
        fault_index = len(read_lines(log))
        record = await asyncio.to_thread(ctx.inject, fault, run)
        if record.node is None:
            raise BenchError(f"{fault} injection {record.id} recorded no node")
        say(f"{launcher} x {fault}: injected {record.kind} rank {record.rank} on {record.node} at {record.t0:%T.%f}")
        status, scanned, timed_out = await _wait_outcome(
            ctx, run_dir, job_id, before, record.node, opts.fault_timeout_s
        )
        ckpt = scanned.latest_valid if scanned is not None else None
        result = score_fault(
            Observed(
                launcher=launcher,
                fault=fault,
                run=run,
                job_id=job_id,
                t0=record.t0,
                target_rank=record.rank,
                node=record.node,
                status=status,
                before=frozenset(before),
                drained_before=frozenset(drained_before),
                drained_after=frozenset(rebound_drained(ctx.nodes(), job_id)),
                excluded=_excluded(ctx, job_id),
                checkpoint_path=ckpt.path if ckpt is not None else "",
                checkpoint_step=ckpt.step if ckpt is not None else None,
                valid_steps=_valid_steps(scanned),
                log_lines=tuple(read_lines(log)),
                fault_index=fault_index,
                timed_out=timed_out,
                wall_s=time.monotonic() - started,
            )
        )
    except (BenchError, InjectionError, ValueError) as e:
        result = FaultResult(
            launcher=launcher,
            fault=fault,
            run=run,
            job_id=job_id,
            error=f"{type(e).__name__}: {e}",
            t0=record.t0 if record is not None else None,
            wall_s=round(time.monotonic() - started, 1),
        )
    say(
        f"{launcher} x {fault}: {'pass' if result.passed else 'FAIL ' + result.error} blamed "
        f"{','.join(result.implicated_nodes) or '-'} (truth {result.truth_node}) detection={result.detection_s} "
        f"action={result.action_s} resume={result.resume_s} ckpt={result.checkpoint_step} "
        f"resumed={result.resumed_step} lost={result.lost_steps}"
    )
    try:
        await _repair(ctx, fault, record.node if record is not None else None)
    except BenchError as e:
        say(f"{launcher} x {fault}: repairing the lab failed: {e}")
    return result, result.checkpoint_step if result.resumed_step is not None else after


async def run_launcher(ctx: BenchContext, opts: LauncherOptions, launcher: Launcher, stamp: str) -> list[FaultResult]:
    """One job of ``launcher`` through ``opts.faults`` in turn; the job cancelled at the end."""
    from deploy.demo.submit import SubmitError, submit_demo
    from deploy.local.processes import LabError

    run = f"bench-{launcher}-{stamp}"
    layout = ctx.lab.cfg.layout
    results: list[FaultResult] = []
    job_id: int | None = None
    try:
        await ctx.prepare_lab()
        how = SUBMIT[launcher]
        job_id = jid = submit_demo(
            layout,
            run,
            steps=100_000,
            tasks_per_node=how.tasks_per_node,
            gpus_per_node=how.tasks_per_node,
            checkpoint_every=how.checkpoint_every,
            env=ctx.lab.slurm.env(),
            opt_in=True,
            launcher=how.launcher,
            trainer=how.trainer,
            budget=RESTART_BUDGET,
        )
        say(f"{launcher}: submitted job {jid} (run {run})")

        async def monitored() -> bool:
            return await ctx.status(jid) is not None

        await until(f"job {jid}'s JobRecovery workflow", ctx.opts.setup_timeout_s, 0.5, monitored)
        after: int | None = None
        for fault in opts.faults:
            result, after = await _one_fault(ctx, opts, launcher, fault, run, jid, after)
            results.append(result)
    except (BenchError, SubmitError, LabError, ValueError) as e:
        say(f"{launcher}: {type(e).__name__}: {e}")
    done = {r.fault for r in results}
    for fault in opts.faults:
        if fault not in done:
            results.append(
                FaultResult(
                    launcher=launcher, fault=fault, run=run, job_id=job_id, error="not run: the job never trained"
                )
            )
    await _finish(ctx, job_id)
    return results


async def _finish(ctx: BenchContext, job_id: int | None) -> None:
    from temporalio.service import RPCError

    from activities.temporal.rebound_workflows import terminate_job_recovery
    from deploy.local.processes import LabError

    if job_id is None:
        return
    with contextlib.suppress(RPCError):
        await terminate_job_recovery(ctx.client, ctx.settings.cluster_name, job_id, "rebound bench: launcher measured")
    try:
        ctx.slurm("scancel", str(job_id))

        async def gone() -> bool:
            return ctx.job_state(job_id) in ENDED_STATES

        await until(f"job {job_id} gone", 60.0, 0.5, gone)
    except (LabError, BenchError) as e:
        say(f"cancelling job {job_id}: {e}")


async def run_launchers(
    lab: Lab, settings: Settings, opts: LauncherOptions, json_path: Path | None = None
) -> list[FaultResult]:
    """Every launcher, one job each, its faults in order; the JSON report rewritten after each launcher (a long run
    cut short keeps what it measured)."""
    from workers.client import connect

    await asyncio.to_thread(lab.up, log=False)  # before connecting: Temporal is one of its parts
    bench = BenchOptions(setup_timeout_s=opts.train_timeout_s)
    ctx = BenchContext(lab=lab, client=await connect(settings.temporal), settings=settings, opts=bench)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    results: list[FaultResult] = []
    for launcher in opts.launchers:
        results += await run_launcher(ctx, opts, launcher, stamp)
        if json_path is not None:
            _write_json(json_path, results)
    return results


def _write_json(path: Path, results: list[FaultResult]) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report(results), indent=2) + "\n")


def run_launchers_command(args: argparse.Namespace) -> int:
    """``rebound bench launchers``: run, print the table, write the JSON; exit 1 when a fault failed."""

    from deploy.local.config import LabConfig
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab

    try:
        opts = LauncherOptions(
            launchers=parse_names(args.launchers, LAUNCHERS, "launcher"),
            faults=parse_names(args.faults, FAULTS, "fault"),
            fault_timeout_s=args.timeout,
        )
        lab = Lab(LabConfig(nodes=args.lab_nodes))
    except ValueError as e:
        print(f"rebound bench launchers: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    json_path = Path(args.json) if args.json is not None else None
    results = asyncio.run(run_launchers(lab, lab_settings(lab), opts, json_path))
    print(format_table(results))
    for line in failures(results):
        print(f"  {line}")
    print(f"\n{sum(r.passed for r in results)}/{len(results)} passed in {time.monotonic() - started:.0f} s")
    if json_path is not None:
        print(f"wrote {json_path}")
    return 0 if all(r.passed for r in results) else 1
