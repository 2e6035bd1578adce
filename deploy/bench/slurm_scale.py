"""``rebound bench slurm-scale``: Rebound on the real Slurm at size (issue 12, item 4).

A lab of its own (``scale_lab_config``: 64 slurmd by default, one node-agent process serving every node's queue,
its own state directory, cluster name and ports, so the default lab and the e2e test lab are untouched) runs
~1,000 small opted-in shell jobs (``scale_job.sh``: a step line a second, one CPU each). The benchmark then:

1. submits them (sbatch argument lists), waits until they run and ClusterWatch started a JobRecovery for each;
2. counts which jobs hold a running watch activity (``scale_probe.watch_census``) and measures the machine's CPU
   per process over a quiet window;
3. samples ``squeue --json`` and ``sinfo --json`` at that size (wall time, CPU, bytes, Rebound's parse time);
4. injects real faults: SIGKILL of some jobs' batch shells (watched and unwatched ones), then an XID 79 on the
   fake GPUs of one node, and measures Rebound's detection latency per job from its JobRecovery's incidents;
5. takes the lab down and deletes its state (``--keep-state`` keeps it for a look).

Everything is real: the scheduler, the worker with the lab's settings, the node agents' GPU push path.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from deploy.bench.context import BenchError, read_lines, say
from deploy.bench.scale_probe import (
    WatchCensus,
    incidents_by_job,
    measure_json_read,
    watch_census,
)
from deploy.demo.submit import parse_job_id
from deploy.local.config import LabConfig
from deploy.local.processes import LabError, run
from deploy.scale.measure import ProcSampler
from workflows.domain.base import Frozen

if TYPE_CHECKING:
    from temporalio.client import Client

    from deploy.local.lab import Lab
    from workers.settings import Settings

__all__ = ["ScaleOptions", "run_slurm_scale", "scale_lab_config", "take_down"]

SCALE_JOB = Path(__file__).with_name("scale_job.sh")
XID = 79  # fell off the bus: the catalogue drains the node, every job on it must hear of it


class ScaleOptions(Frozen):
    nodes: int = Field(64, ge=2, le=64)
    jobs: int = Field(1000, ge=1, le=5000)
    samples: int = Field(5, ge=1, le=50)
    """Runs of each of squeue --json and sinfo --json."""
    kills: int = Field(3, ge=0, le=20)
    """Jobs whose batch shell is SIGKILLed, among the watched ones and again among the unwatched ones."""
    xid_nodes: int = Field(1, ge=0, le=4)
    window_s: float = Field(60.0, gt=0)
    """Quiet window over which the processes' CPU is averaged."""
    settle_s: float = Field(30.0, ge=0)
    """After every job has its JobRecovery: how long the watches get to take their slots before the census."""
    setup_timeout_s: float = Field(900.0, gt=0)
    stall_s: float = Field(90.0, gt=0)
    """A count of running jobs (or of their workflows) that grew no more for this long is taken as final."""
    detect_timeout_s: float = Field(120.0, gt=0)
    step_s: float = Field(1.0, gt=0)
    state_dir: Path = Path(".rebound-lab-scale")
    keep_state: bool = False


def scale_lab_config(opts: ScaleOptions) -> LabConfig:
    """The lab at size. One CPU per job, spread over the nodes (``SelectTypeParameters=CR_Core`` makes memory no
    consumable resource, so nothing is oversubscribed: each job really owns one of the configured CPUs, which
    ``SlurmdParameters=config_overrides`` lets a 2-core host claim). Slurm's node timeouts are raised from the
    lab's fast 3/2 s: 64 slurmd on a loaded 2-core host must not be declared dead by a late ping (this run measures
    process kills and XIDs, not node deaths)."""
    return LabConfig(
        state_dir=opts.state_dir,
        cluster_name="labscale",
        nodes=opts.nodes,
        cpus_per_node=max(4, math.ceil(opts.jobs / opts.nodes)),
        gpus_per_node=4,
        nodes_per_agent=opts.nodes,
        slurmctld_port=6837,
        slurmd_port_base=17101,
        slurmrestd_port=6840,
        temporal_port=7253,
        temporal_ui_port=8253,
        temporal_tls_port=7254,
        slurmrestd_tls_port=6841,
        slurmd_timeout_s=30,
        message_timeout_s=10,
        ready_timeout_s=300.0,
    )


def sbatch_argv(run_dir: Path, index: int, step_s: float) -> list[str]:
    """One small opted-in job: one task, one CPU, its output where its comment tells Rebound to read it."""
    log = f"{run_dir}/job-%j.log"
    return [
        "sbatch",
        "--parsable",
        f"--job-name=scale-{index}",
        "--ntasks=1",
        "--cpus-per-task=1",
        "--requeue",
        "--open-mode=append",
        f"--output={log}",
        f"--chdir={run_dir}",
        # ALL, as the demo does: NONE (and, on 22.05, NIL) makes slurmd load the user's login environment for
        # every job (`su - root -c ... slurmstepd getenv`): 1,000 login shells took the 2-core host to a load of 580.
        "--export=ALL",
        f"--comment=rebound: logs={log}",
        str(SCALE_JOB),
        f"{step_s:g}",
    ]


def submit_all(lab: Lab, run_dir: Path, opts: ScaleOptions) -> list[int]:
    """Submit every job (a few sbatch at a time: each mostly waits on slurmctld)."""
    env = lab.slurm.env()

    def one(index: int) -> int:
        return parse_job_id(run(sbatch_argv(run_dir, index, opts.step_s), env=env, timeout=120))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, range(opts.jobs)))


def running_jobs(lab: Lab) -> dict[int, str]:
    """Running jobs and their node (``squeue`` text, the cheap read)."""
    out = run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %N"], env=lab.slurm.env(), timeout=60)
    jobs: dict[int, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            jobs[int(parts[0])] = parts[1]
    return jobs


async def monitored_count(client: Client, cluster: str) -> int | None:
    """Running JobRecovery workflows of the cluster; None when Temporal did not answer (a loaded dev server
    answers some calls with a transient "namespace not found"; the caller asks again)."""
    from temporalio.service import RPCError

    from workflows.constants import JOB_RECOVERY_WORKFLOW

    query = f'WorkflowType = "{JOB_RECOVERY_WORKFLOW}" AND ReboundCluster = "{cluster}" AND ExecutionStatus = "Running"'
    try:
        return (await client.count_workflows(query)).count
    except RPCError as e:
        say(f"counting JobRecovery workflows failed: {e}")
        return None


def batch_pid(run_dir: Path, job_id: int) -> int:
    """The job's batch shell, as its first line names it, checked to really be that job's (never a stranger)."""
    lines = read_lines(run_dir / f"job-{job_id}.log")
    first = next((ln for ln in lines if ln.startswith("rebound-scale-job pid=")), None)
    if first is None:
        raise BenchError(f"job {job_id} printed no pid line")
    pid = int(first.split("pid=", 1)[1].split()[0])
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as e:
        raise BenchError(f"job {job_id}'s shell {pid} is gone: {e}") from None
    if f"SLURM_JOB_ID={job_id}".encode() not in environ:
        raise BenchError(f"process {pid} is not job {job_id}'s batch shell")
    return pid


class FaultOutcome(Frozen):
    job_id: int
    fault: str
    node: str
    watched: bool
    """The job's watch activity was running on a worker slot when the fault was injected."""
    injected_at: datetime
    detected_s: float | None = None
    """The incident's ``detected_at`` minus the injection (for an XID ``detected_at`` is when the agent read the
    event, so a workflow that took the signal late still shows a small figure: see ``seen_s``)."""
    seen_s: float | None = None
    """When the benchmark's status poll (every ~1 s) first saw the incident, minus the injection: an upper bound
    of when the workflow had recorded it."""
    anomaly: str = ""
    action_s: float | None = None
    """From detection to the last recovery action verified (``Incident.restarted_at``)."""
    state: str = ""


async def _outcomes(
    client: Client, settings: Settings, faults: list[FaultOutcome], timeout_s: float
) -> list[FaultOutcome]:
    """Poll each faulted job's JobRecovery until every one has detected (and acted) or time runs out."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workers.jobs_cli import query_status
    from workflows.domain.errors import ReboundError

    done: dict[int, FaultOutcome] = {}
    deadline = time.monotonic() + timeout_s
    pending = list(faults)
    while pending and time.monotonic() < deadline:
        still = []
        for f in pending:
            try:
                st = await query_status(client, settings, f.job_id)
            except (ReboundError, RPCError, WorkflowQueryFailedError):
                still.append(f)
                continue
            incident = next((i for i in st.incidents if i.detected_at >= f.injected_at), None)
            update: dict[str, Any] = {"state": st.state.value}
            if incident is not None:
                update["detected_s"] = (incident.detected_at - f.injected_at).total_seconds()
                earlier = done.get(f.job_id)
                seen = earlier.seen_s if earlier is not None and earlier.seen_s is not None else None
                update["seen_s"] = seen if seen is not None else (datetime.now(UTC) - f.injected_at).total_seconds()
                update["anomaly"] = incident.anomaly.kind.value
                if incident.restarted_at is not None:
                    update["action_s"] = (incident.restarted_at - incident.detected_at).total_seconds()
            done[f.job_id] = f.model_copy(update=update)
            if incident is None or incident.restarted_at is None:
                still.append(f)
        pending = still
        if pending:
            await asyncio.sleep(1.0)
    return [done.get(f.job_id, f) for f in faults]


def _kill_targets(census: WatchCensus, running: dict[int, str], kills: int) -> list[tuple[int, bool]]:
    watched = [j for j in census.watching if j in running][:kills]
    unwatched = [j for j in (*census.watch_waiting, *census.anchor_waiting) if j in running][:kills]
    return [(j, True) for j in watched] + [(j, False) for j in unwatched]


def _xid_nodes(census: WatchCensus, running: dict[int, str], count: int, avoid: set[int]) -> list[str]:
    """Nodes hosting the most watched jobs (so both kinds are on them), none of the killed jobs' nodes."""
    busy = {running[j] for j in avoid if j in running}
    score: dict[str, int] = {}
    for j in census.watching:
        node = running.get(j)
        if node is not None and node not in busy:
            score[node] = score.get(node, 0) + 1
    return sorted(score, key=lambda n: -score[n])[:count]


async def inject_kills(
    client: Client, settings: Settings, run_dir: Path, targets: Sequence[tuple[int, bool]], running: dict[int, str],
    timeout_s: float,
) -> list[FaultOutcome]:  # fmt: skip
    faults = []
    for job_id, watched in targets:
        pid = batch_pid(run_dir, job_id)
        at = datetime.now(UTC)
        os.kill(pid, signal.SIGKILL)
        faults.append(FaultOutcome(job_id=job_id, fault="kill", node=running[job_id], watched=watched, injected_at=at))
    say(f"killed the batch shells of {len(faults)} jobs; waiting for Rebound")
    return await _outcomes(client, settings, faults, timeout_s)


async def inject_xids(
    lab: Lab, client: Client, settings: Settings, nodes: Sequence[str], census: WatchCensus, timeout_s: float
) -> list[FaultOutcome]:
    from deploy.local.fake_nvml_state import append_xid

    running = running_jobs(lab)
    watching = set(census.watching)
    faults = []
    for node in nodes:
        at = datetime.now(UTC)
        append_xid(lab.cfg.layout.nvml_state(node), 0, XID)
        faults += [
            FaultOutcome(job_id=j, fault=f"xid{XID}", node=node, watched=j in watching, injected_at=at)
            for j, n in running.items()
            if n == node
        ]
    say(f"XID {XID} on {', '.join(nodes)}: {len(faults)} jobs run there; waiting for Rebound")
    return await _outcomes(client, settings, faults, timeout_s)


def _pids(lab: Lab) -> dict[str, int]:
    found = {
        "worker": lab.rebound.pid("worker"),
        "agents": lab.rebound.pid(lab.cfg.agent_groups()[0][0]),
        "slurmctld": lab.slurm.pid("slurmctld"),
        "temporal": lab.temporal.pid(),
    }
    return {k: v for k, v in found.items() if v is not None}


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _until_all_or_stalled(what: str, opts: ScaleOptions, count: Callable[[], Awaitable[int]]) -> int:
    """Wait until ``count()`` reaches the number of jobs, or has not grown for ``stall_s`` (a job Slurm could not
    launch stays held, and is reported, rather than stopping the run); returns the last count.

    Raises:
        BenchError: still short of the jobs after ``setup_timeout_s``.
    """
    deadline = time.monotonic() + opts.setup_timeout_s
    best, grew_at = -1, time.monotonic()
    while True:
        now_count = await count()
        if now_count > best:
            best, grew_at = now_count, time.monotonic()
        if best >= opts.jobs:
            return best
        if time.monotonic() - grew_at > opts.stall_s:
            say(f"{what}: {best} of {opts.jobs}, no more for {opts.stall_s:.0f} s; going on with those")
            return best
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: {best} of {opts.jobs} after {opts.setup_timeout_s:.0f} s")
        await asyncio.sleep(5.0)


async def run_slurm_scale(lab: Lab, client: Client, settings: Settings, opts: ScaleOptions) -> dict[str, Any]:
    """The whole measured run on a lab that is up and has no jobs; returns the result (see the module doc)."""
    result: dict[str, Any] = {"nodes": opts.nodes, "jobs": opts.jobs, "cpus_per_node": lab.cfg.cpus_per_node}
    result["load_before"] = os.getloadavg()
    mem_before = _mem_available_mb()
    run_dir = lab.cfg.layout.runs / "scale"
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    job_ids = await asyncio.to_thread(submit_all, lab, run_dir, opts)
    result["submit_s"] = time.monotonic() - started
    say(f"submitted {len(job_ids)} jobs in {result['submit_s']:.0f} s")

    async def running_count() -> int:
        return len(await asyncio.to_thread(running_jobs, lab))

    result["running"] = await _until_all_or_stalled("jobs running", opts, running_count)
    result["all_running_s"] = time.monotonic() - started

    async def monitored() -> int:
        return await monitored_count(client, settings.cluster_name) or 0

    result["monitored"] = await _until_all_or_stalled("JobRecovery workflows", opts, monitored)
    result["all_monitored_s"] = time.monotonic() - started
    say(f"{result['running']} jobs run, {result['monitored']} JobRecovery workflows "
        f"({result['all_monitored_s']:.0f} s); settling {opts.settle_s:g} s")  # fmt: skip
    await asyncio.sleep(opts.settle_s)
    census = await watch_census(client, settings.cluster_name, job_ids)
    result["census"] = _census_dict(census)
    say(f"watches: {len(census.watching)} running, {len(census.watch_waiting)} waiting for a slot, "
        f"{len(census.anchor_waiting)} waiting to anchor, {len(census.other)} other")  # fmt: skip

    sampler = ProcSampler(_pids(lab))  # a process's CPU includes its children's: the worker's squeue runs
    sampler.start()
    await asyncio.sleep(opts.window_s)
    sampler.sample()
    result["cpu_cores"] = {**sampler.cores(), "window_s": opts.window_s}
    result["rss_mb"] = dict(sampler.peak_rss)
    result["mem_used_by_lab_mb"] = mem_before - _mem_available_mb()
    result["load_steady"] = os.getloadavg()

    env = lab.slurm.env()
    reads = []
    for _ in range(opts.samples):
        # Exactly as the worker's CLI adapter runs them (activities/slurm/cli.py).
        for argv in (["squeue", "--json", "-a"], ["sinfo", "--json"]):
            reads.append(await asyncio.to_thread(measure_json_read, argv, env))
    result["reads"] = [r.model_dump() for r in reads]

    running = running_jobs(lab)
    kills = _kill_targets(census, running, opts.kills)
    outcomes = await inject_kills(client, settings, run_dir, kills, running, opts.detect_timeout_s)
    nodes = _xid_nodes(census, running, opts.xid_nodes, {j for j, _ in kills})
    outcomes += await inject_xids(lab, client, settings, nodes, census, opts.detect_timeout_s)
    result["faults"] = [o.model_dump(mode="json") for o in outcomes]
    faulted = {o.job_id for o in outcomes}
    others = await incidents_by_job(client, settings, [j for j in job_ids if j not in faulted])
    result["false_incidents"] = {str(j): kinds for j, kinds in others.items()}
    result["census_after"] = _census_dict(await watch_census(client, settings.cluster_name, job_ids))
    return result


def _census_dict(census: WatchCensus) -> dict[str, int]:
    return {
        "workflows": census.workflows,
        "watching": len(census.watching),
        "watch_waiting": len(census.watch_waiting),
        "anchor_waiting": len(census.anchor_waiting),
        "other": len(census.other),
    }


async def run_on_fresh_lab(opts: ScaleOptions) -> dict[str, Any]:
    """Bring the scale lab up from nothing, run, and take it down (its state deleted unless ``keep_state``)."""
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab
    from workers.client import connect

    lab = Lab(scale_lab_config(opts))
    with contextlib.suppress(LabError):
        lab.down()
    shutil.rmtree(lab.cfg.state_dir, ignore_errors=True)  # a previous run's workflows and jobs would count
    try:
        took = await asyncio.to_thread(lab.up, log=False)
        say(f"scale lab up: {opts.nodes} slurmd, {lab.cfg.cpus_per_node} CPUs each, one agent process ({took:.0f} s)")
        settings = lab_settings(lab)
        client = await connect(settings.temporal)
        result = await run_slurm_scale(lab, client, settings, opts)
        result["lab_up_s"] = took
        return result
    finally:
        say("taking the scale lab down")
        with contextlib.suppress(LabError):
            await asyncio.to_thread(_down, lab)
        if not opts.keep_state:
            shutil.rmtree(lab.cfg.state_dir, ignore_errors=True)


def _down(lab: Lab, drain_timeout_s: float = 120.0) -> None:
    """Rebound first (so a thousand cancellations are not a thousand recoveries), then every job cancelled and
    gone while the slurmds still run to end them, then the rest of the lab."""
    lab.rebound.stop()
    if lab.slurm.pid("slurmctld") is not None:
        env = lab.slurm.env()
        with contextlib.suppress(LabError):
            run(["scancel", "--user=root"], env=env, timeout=60)
            deadline = time.monotonic() + drain_timeout_s
            while run(["squeue", "-h", "-o", "%i"], env=env, timeout=60).strip() and time.monotonic() < deadline:
                time.sleep(2.0)
    lab.down()


def take_down(opts: ScaleOptions) -> None:
    """Take down the scale lab of these options (one a killed run left behind) and delete its state."""
    from deploy.local.lab import Lab

    lab = Lab(scale_lab_config(opts))
    with contextlib.suppress(LabError):
        _down(lab)
    shutil.rmtree(lab.cfg.state_dir, ignore_errors=True)
