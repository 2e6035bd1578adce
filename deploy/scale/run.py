"""``rebound bench scale``: one run per job count against the real worker, agents and Temporal dev server.

A run: generate the cluster and serve it (``scheduler.FakeSlurm``), start the log writer, Temporal, the node
agents and the worker; wait until ClusterWatch has a JobRecovery running for every job, then a warm-up; then the
measurement window (``--minutes``): faults injected on schedule, CPU/RSS sampled, the server's action counters read
at both ends; then a settling period (the last faults' detections and recoveries, never counted in the costs);
then the incidents (one query per job), the history events of the window, the parse time of the final listings.
Job logs, listings and fake GPU states live under ``/dev/shm`` and are removed at the end of every run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from activities.slurm.hostlist import compress
from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from deploy.local.fake_nvml_state import append_xid
from deploy.local.node_agents import state_file
from deploy.scale.cluster import JobChange, SyntheticCluster
from deploy.scale.faults import FaultKind, InjectedFault, PlannedFault, faults_per_kind, plan_faults
from deploy.scale.measure import HEARTBEAT_ACTION, ProcSampler, actions_from_metrics, scrape
from deploy.scale.reads import (
    history_events,
    hub_members,
    incidents,
    wait_hub_members,
    wait_steady,
    wait_watched,
    waiting_activities,
)
from deploy.scale.scheduler import FakeSlurm
from deploy.scale.score import Costs, RunResult, early_incidents, format_table, report_json, score
from deploy.scale.stack import Stack
from workers.client import connect
from workers.settings import TemporalSettings
from workflows.domain.incident import Incident

__all__ = ["LogWriter", "ScaleCluster", "ScaleOptions", "inject", "run_scale_command", "scale_cluster"]

#: Bytes of one step line (about 100) x ranks x jobs x seconds must fit this tmpfs budget unless raised.
DEFAULT_LOG_BUDGET_MB = 4096
_LINE_BYTES = 110


@dataclass(frozen=True)
class ScaleOptions:
    ranks: int = 8
    minutes: float = 10.0
    faults: int | None = None
    settle_s: float = 180.0
    warmup_s: float = 20.0
    push_poll_s: float = 0.1
    log_budget_mb: int = DEFAULT_LOG_BUDGET_MB
    keep: bool = False
    seed: int = 12
    workers: int = 1
    kill_worker_at: float | None = None
    """SIGKILL ``worker-0`` this fraction of the way into the window (a crash under load) and time the takeover."""
    feed: str | None = None
    """``watch.scheduler_feed`` for the workers (None: the production default)."""

    def worker_env(self) -> dict[str, str]:
        return {} if self.feed is None else {"REBOUND_WATCH__SCHEDULER_FEED": self.feed}


class LogWriter:
    """The log writer process and its answers (``deploy.scale.logwriter``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.waiting: dict[int, asyncio.Future[float]] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            answer = json.loads(line)
            future = self.waiting.pop(int(answer["id"]), None)
            if future is not None and not future.done():
                future.set_result(float(answer["t"]))

    def send(self, cmd: dict[str, object]) -> asyncio.Future[float]:
        assert self.proc.stdin is not None
        self.next_id += 1
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = future
        self.proc.stdin.write((json.dumps({**cmd, "id": self.next_id}) + "\n").encode())
        return future

    def change(self, change: JobChange) -> None:
        if change.running:
            self.send({"op": "run", "job": change.job_id, "node": change.node, "restart": change.restart_count})
        else:
            self.send({"op": "stop", "job": change.job_id})

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
        self.reader.cancel()


async def inject(
    fault: PlannedFault, fake: FakeSlurm, writer: LogWriter, nvml_dir: Path, record: list[InjectedFault]
) -> None:
    job = fake.cluster.jobs[fault.job_id]
    node = job.node
    if job.state != "RUNNING":
        return  # a restart of an earlier fault's job still pending: nothing to break now
    if fault.kind is FaultKind.XID:
        t0 = time.time()
        await asyncio.to_thread(append_xid, state_file(nvml_dir, node), fault.target, 79)
    elif fault.kind is FaultKind.HANG:
        t0 = await writer.send({"op": "hang", "job": fault.job_id})
    else:
        t0 = await writer.send({"op": "crash", "job": fault.job_id, "rank": fault.target})
    record.append(InjectedFault(kind=fault.kind, job_id=fault.job_id, node=node, target=fault.target, t0=t0))
    if fault.kind is FaultKind.CRASH:
        await asyncio.sleep(1.0)  # srun ends the job once its tasks are gone
        fake.fail(fault.job_id)


def _parse_seconds(root: Path) -> float:
    squeue, sinfo = (root / "squeue.json").read_bytes(), (root / "sinfo.json").read_bytes()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        parse_jobs(load_payload(squeue, source="squeue --json"))
        parse_nodes(load_payload(sinfo, source="sinfo --json"))
        times.append(time.perf_counter() - t)
    return round(statistics.median(times), 4)


@dataclass
class ScaleCluster:
    """A synthetic cluster with the real processes watching it (``scale_cluster``): what a run drives and reads."""

    cluster: SyntheticCluster
    fake: FakeSlurm
    writer: LogWriter
    stack: Stack
    client: Client
    shm: Path
    """Job logs, listings and fake GPU states (``/dev/shm``, removed at the end)."""
    work: Path
    """Process logs, the Temporal database, the worker's state."""


@contextlib.asynccontextmanager
async def scale_cluster(
    jobs: int,
    *,
    ranks: int,
    spare_nodes: int,
    push_poll_s: float,
    log_budget_mb: int,
    keep: bool = False,
    worker_env: Mapping[str, str] | None = None,
    workers: int = 1,
    stop_timeout_s: float = 20.0,
) -> AsyncIterator[ScaleCluster]:
    """Generate and serve the cluster, start the log writer, Temporal, the node agents and ``workers`` workers (each
    with its own state directory, as on separate machines); yield once they have started (the caller waits for what
    it needs: ``reads.wait_watched``); stop all at the end.

    ``worker_env``: settings for the worker beyond the benchmark's (``REBOUND_...`` variables; the benchmark passes
    none: production settings). ``stop_timeout_s``: how long each process may take to stop at the end (SIGTERM,
    then SIGKILL)."""
    name = f"rebound-scale-{os.getpid()}-{jobs}-{time.monotonic_ns()}"
    shm, work = Path("/dev/shm") / name, Path(tempfile.gettempdir()) / name
    for d in (shm / "logs", shm / "nvml", work / "state"):
        d.mkdir(parents=True, exist_ok=True)
    cluster = SyntheticCluster.create(
        jobs=jobs,
        ranks=ranks,
        spare_nodes=spare_nodes,
        log_root=str(shm / "logs"),
        user=(getpass.getuser(), os.getuid()),
        now=time.time(),
    )
    # The worker refuses to start without log roots (workers.log_policy): the synthetic jobs write under shm/logs.
    roots = {"REBOUND_WATCH__LOG_ROOTS": json.dumps([str(shm / "logs")])}
    stack = Stack(work=work, bin_dir=shm / "bin", worker_env={**roots, **(worker_env or {})})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.scale.logwriter",
        str(shm / "logs"),
        "--ranks",
        str(ranks),
        "--max-bytes",
        str(log_budget_mb * 1024 * 1024),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=stack.rebound_env(work / "state"),
    )
    writer = LogWriter(proc)
    fake = FakeSlurm(cluster, shm, writer.change)
    ticker: asyncio.Task[None] | None = None
    try:
        fake.install()
        await fake.start()
        for job in cluster.jobs.values():
            writer.change(JobChange(job.job_id, running=True, node=job.node))

        async def tick() -> None:
            while True:
                fake.tick()
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(tick())
        stack.start_temporal(len(cluster.nodes))
        client = await _connect(stack)
        stack.start_agents(compress(list(cluster.nodes)), shm / "nvml", ranks, push_poll_s, work / "state")
        for index in range(workers):
            stack.start_worker(index, work / f"state-{index}" if index else work / "state")
        yield ScaleCluster(cluster, fake, writer, stack, client, shm, work)
    finally:
        if ticker is not None:
            ticker.cancel()
        stack.stop([n for n in stack.procs if n != "temporal"], stop_timeout_s)
        stack.stop(term_timeout_s=stop_timeout_s)
        await writer.close()
        await fake.stop()
        shutil.rmtree(shm, ignore_errors=True)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


async def run_one(jobs: int, opts: ScaleOptions) -> RunResult:
    per_kind = faults_per_kind(jobs, opts.faults)
    window_s = opts.minutes * 60.0
    budget = _LINE_BYTES * opts.ranks * jobs * (window_s + opts.warmup_s + opts.settle_s + 300)
    if budget > opts.log_budget_mb * 1024 * 1024:
        raise ValueError(
            f"{jobs} jobs x {opts.ranks} ranks for this long write ~{budget / 2**20:.0f} MB of logs: "
            f"raise --log-budget-mb (tmpfs) or shorten --minutes"
        )
    async with scale_cluster(
        jobs,
        ranks=opts.ranks,
        spare_nodes=max(8, jobs // 5 + per_kind * 2),
        push_poll_s=opts.push_poll_s,
        log_budget_mb=opts.log_budget_mb,
        keep=opts.keep,
        worker_env=opts.worker_env(),
        workers=opts.workers,
    ) as run:
        return await _measure(run, jobs, per_kind, opts)


async def _measure(run: ScaleCluster, jobs: int, per_kind: int, opts: ScaleOptions) -> RunResult:
    cluster, fake, writer, stack, client, shm = run.cluster, run.fake, run.writer, run.stack, run.client, run.shm
    window_s = opts.minutes * 60.0
    print(f"[{jobs} jobs] stack up (temporal {stack.address}); waiting for every job's JobRecovery", flush=True)
    t_up = time.monotonic()
    recovering = await wait_watched(client, jobs, stack, timeout_s=max(180.0, jobs * 0.9))
    up_s = time.monotonic() - t_up
    print(f"[{jobs} jobs] {recovering} JobRecovery workflows running after {up_s:.0f} s", flush=True)
    steady_s, slowest = await wait_steady(client, list(cluster.jobs), stack, timeout_s=max(300.0, jobs * 0.6))
    print(
        f"[{jobs} jobs] worker steady {steady_s:.0f} s later (slowest status answer of a sample: {slowest:.2f} s)",
        flush=True,
    )
    await asyncio.sleep(opts.warmup_s)
    plan = plan_faults(
        list(cluster.jobs),
        per_kind,
        start_s=min(10.0, window_s / 6),
        end_s=window_s * 0.85,
        ranks=opts.ranks,
        seed=opts.seed,
    )
    worker_names = [n for n in stack.procs if n.startswith("worker-")]
    pids = {
        **{n: stack.procs[n].pid for n in worker_names},
        "server": stack.procs["temporal"].pid,
        "agents": stack.procs["agents"].pid,
        "writer": writer.proc.pid,
    }
    sampler = ProcSampler(pids)
    before = actions_from_metrics(await asyncio.to_thread(scrape, stack.metrics_url), "default")
    w0 = datetime.now(UTC)
    sampler.start()
    print(f"[{jobs} jobs] window of {opts.minutes:g} min, {len(plan)} faults; load {_load()}", flush=True)
    injected: list[InjectedFault] = []
    pending = list(plan)
    started = time.monotonic()
    injections: list[asyncio.Task[None]] = []
    kill_at_s = None if opts.kill_worker_at is None else opts.kill_worker_at * window_s
    takeover: asyncio.Task[float | None] | None = None
    while (elapsed := time.monotonic() - started) < window_s:
        while pending and pending[0].at_s <= elapsed:
            injections.append(asyncio.create_task(inject(pending.pop(0), fake, writer, shm / "nvml", injected)))
        if kill_at_s is not None and takeover is None and elapsed >= kill_at_s:
            takeover = asyncio.create_task(_kill_and_time_takeover(stack, jobs, window_s - elapsed))
        sampler.sample()
        stack.check_alive()
        await asyncio.sleep(1.0)
    cores = sampler.cores()
    w1 = datetime.now(UTC)
    after = actions_from_metrics(await asyncio.to_thread(scrape, stack.metrics_url), "default")
    by_type = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:8]
    print(f"[{jobs} jobs] actions in the window by type: " + ", ".join(f"{k} {v:.0f}" for v, k in by_type if v))
    waiting = await waiting_activities(client, list(cluster.jobs))
    print(f"[{jobs} jobs] activities waiting > 10 s for a worker slot at the window's end: {dict(waiting)}")
    await asyncio.gather(*injections)
    takeover_s = None if takeover is None else await takeover
    print(f"[{jobs} jobs] window closed (load {_load()}); settling up to {opts.settle_s:.0f} s", flush=True)
    found = await _settle(client, injected, opts.settle_s)
    rest = [j for j in cluster.jobs if j not in found]
    found.update(await incidents(client, rest, attempts=3, timeout_s=60.0))
    unread = [j for j in cluster.jobs if j not in found]
    if unread:
        print(f"[{jobs} jobs] {len(unread)} job(s) never answered their status query: {unread[:20]}", flush=True)
    outcomes, false_count, extra = score(injected, found)
    for line in early_incidents(injected, found)[:20]:
        print(f"[{jobs} jobs] false incident: {line}", flush=True)
    costs = Costs(
        window_s=round((w1 - w0).total_seconds(), 1),
        worker_cpu_cores=round(sum(cores[n] for n in worker_names), 3),
        worker_rss_mb=round(max(sampler.peak_rss[n] for n in worker_names), 1),
        server_cpu_cores=cores["server"],
        server_rss_mb=round(sampler.peak_rss["server"], 1),
        machine_cpu_cores=cores["machine"],
        actions=sum(after.values()) - sum(before.values()),
        heartbeats=after.get(HEARTBEAT_ACTION, 0.0) - before.get(HEARTBEAT_ACTION, 0.0),
        history_events=await history_events(client, w0, w1),
        snapshot_parse_s=_parse_seconds(shm),
        agents_cpu_cores=cores["agents"],
        writer_cpu_cores=cores["writer"],
    )
    verbs = Counter(" ".join(str(a) for a in c["argv"][:1]) for c in fake.commands)
    print(
        f"[{jobs} jobs] scontrol calls: {dict(verbs)}; restarts: {sum(j.restart_count for j in cluster.jobs.values())}",
        flush=True,
    )
    return RunResult(
        jobs=jobs,
        ranks=opts.ranks,
        workers=opts.workers,
        minutes=opts.minutes,
        costs=costs,
        faults=outcomes,
        false_incidents=false_count,
        extra_incidents=extra,
        scheduler_commands=len(fake.commands),
        unknown_commands=tuple(cluster.unknown_commands),
        waiting_activities=dict(waiting),
        restarts=sum(j.restart_count for j in cluster.jobs.values()),
        jobs_recovering=recovering,
        recovering_after_s=round(up_s, 1),
        steady_after_s=round(steady_s, 1),
        steady_query_s=round(slowest, 2),
        takeover_s=takeover_s,
    )


async def _kill_and_time_takeover(stack: Stack, jobs: int, timeout_s: float) -> float | None:
    """SIGKILL ``worker-0`` and time until the surviving workers' hubs hold every job again (None: not within the
    rest of the window). Whether any job was lost shows in the faults after the kill and the final census."""
    members = await asyncio.to_thread(hub_members, list(stack.worker_metrics.values()))
    stack.kill("worker-0")
    killed = time.monotonic()
    print(f"[{jobs} jobs] SIGKILLed worker-0 (hubs held {members} jobs); load {_load()}", flush=True)
    held = await wait_hub_members(stack, jobs, max(10.0, timeout_s))
    took = round(time.monotonic() - killed, 1)
    print(f"[{jobs} jobs] the surviving workers hold {held} of {jobs} jobs {took} s after the kill", flush=True)
    return took if held == jobs else None


async def _connect(stack: Stack) -> Client:
    """A client once the dev server serves the namespace: it answers before its namespace is registered, and a
    worker or agent started in that gap exits ("Namespace default is not found", seen on a loaded machine)."""
    deadline = time.monotonic() + 60
    while True:
        stack.check_alive()
        with contextlib.suppress(Exception):
            client = await connect(TemporalSettings(address=stack.address))
            await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=client.namespace))
            return client
        if time.monotonic() > deadline:
            raise RuntimeError("the Temporal dev server did not serve its namespace within 60 s")
        await asyncio.sleep(1.0)


async def _settle(client: Client, faults: list[InjectedFault], settle_s: float) -> dict[int, tuple[Incident, ...]]:
    """Poll the faulted jobs until each has an incident with its recovery action done, or ``settle_s`` passed."""
    deadline = time.monotonic() + settle_s
    while True:
        found = await incidents(client, [f.job_id for f in faults], attempts=2)
        outcomes, _, _ = score(faults, found)
        done = sum(1 for o in outcomes if o.action_s is not None)
        if done == len(faults) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(10.0)


def _load() -> str:
    """The machine's 1/5/15-minute load averages: other tenants' work shows here."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_scale_command(args: argparse.Namespace) -> int:
    sizes = [int(x) for x in str(args.jobs).split(",") if x.strip()]
    opts = ScaleOptions(
        ranks=args.ranks,
        minutes=args.minutes,
        faults=args.faults,
        settle_s=args.settle,
        push_poll_s=args.push_poll_s,
        log_budget_mb=args.log_budget_mb,
        keep=args.keep,
        workers=args.workers,
        kill_worker_at=args.kill_worker_at,
        feed=args.feed,
    )
    if opts.kill_worker_at is not None and (opts.workers < 2 or not 0.0 < opts.kill_worker_at < 1.0):
        print("--kill-worker-at needs --workers >= 2 and a fraction of the window in (0, 1)", file=sys.stderr)
        return 2
    runs: list[RunResult] = []
    for jobs in sizes:
        runs.append(asyncio.run(run_one(jobs, opts)))
        print(format_table(runs), flush=True)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report_json(runs), indent=2) + "\n")
    return 0
