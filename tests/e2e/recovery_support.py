"""Helpers of the recovery end-to-end tests: a monitored demo job, its JobRecovery workflow, Slurm's own word.

Everything here reads the real test lab: the workflow's ``status`` query (with a short client-side timeout, so a
dead worker or Temporal server is a retry, not a hang), fresh ``sinfo``/``squeue`` output, slurmctld's log and
the demo's rank logs. Nothing here changes the lab except the worker swaps used by the durability tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.slurm.cli import SlurmCliScheduler
from deploy.demo.submit import submit_demo
from deploy.local.processes import cmdline, descendants, is_alive, kill_and_wait, spawn
from tests.lab_support import LabHandle, end_fleet, lab_rebound_settings
from workers.client import connect
from workflows.constants import job_workflow_id
from workflows.domain.incident import ActionKind, Incident
from workflows.domain.recovery import JobRecoveryStatus, RecoveryState
from workflows.domain.slurm import JobState, SlurmJob
from workflows.job_recovery import JobRecoveryWorkflow

#: A training step of the demo trainer: ``<ts> [INFO] rank=R/4 node=nX step=S loss=... step_time=...s``.
STEP = re.compile(
    r"^\S+Z \[INFO\] rank=(\d+)/\d+ node=(n\d+) step=(\d+) loss=[\d.]+ step_time=[\d.]+s compute_time=[\d.]+s$"
)
RESUMED = re.compile(r"^\S+Z \[INFO\] rank=(\d+)/\d+ node=(n\d+) resumed from checkpoint (step_\d+) \(step (\d+)\)$")
STARTING = re.compile(r"starting: job_id=(\d+) restart=(\d+) ")
#: slurmctld's line for a drain reason (Slurm 22.05): ``update_node: node n2 reason set to: rebound: 31-1 xid-79``.
CTLD_REASON = re.compile(r"update_node: node (\S+) reason set to: (.*)$")
CTLD_REQUEUE = re.compile(r"Requeuing JobId=(\d+)$")

QUERY_TIMEOUT_S = 3.0
DRAIN_PREFIX = "rebound: "


def lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


# ----- the demo job -----------------------------------------------------------------------------------------------
@dataclass
class DemoJob:
    """One submitted demo training job (2 nodes x 2 ranks), opted in to Rebound through its comment."""

    lab: LabHandle
    run: str
    job_id: int

    @property
    def run_dir(self) -> Path:
        return self.lab.layout.run_dir(self.run)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def rank_log(self, rank: int) -> Path:
        return self.run_dir / "logs" / f"job-{self.job_id}-rank-{rank}.log"

    def rank_lines(self, rank: int) -> list[str]:
        return lines(self.rank_log(rank))

    def has_checkpoint(self) -> bool:
        return any(p.is_file() for p in self.checkpoints.glob("step_*/COMPLETE"))

    def attempt_lines(self, rank: int, restart: int) -> list[str]:
        """The lines rank ``rank`` logged in attempt ``restart`` (every attempt appends to the same file)."""
        out: list[str] = []
        current: int | None = None
        for line in self.rank_lines(rank):
            m = STARTING.search(line)
            if m and int(m.group(1)) == self.job_id:
                current = int(m.group(2))
            if current == restart:
                out.append(line)
        return out

    def resumed_and_stepped(self, restart: int) -> tuple[str, str] | None:
        """Rank 0's "resumed from checkpoint" line of attempt ``restart`` and its first step after it."""
        attempt = self.attempt_lines(0, restart)
        for i, line in enumerate(attempt):
            if RESUMED.match(line):
                step = next((later for later in attempt[i + 1 :] if STEP.match(later)), None)
                return (line, step) if step else None
        return None

    def nodes_logged(self, restart: int) -> set[str]:
        """Nodes the ranks of attempt ``restart`` logged training steps on."""
        found: set[str] = set()
        for rank in range(4):
            for line in self.attempt_lines(rank, restart):
                m = STEP.match(line)
                if m:
                    found.add(m.group(2))
        return found


def submit_tracked_demo(
    lab: LabHandle, name: str, *, extra_sbatch_args: Sequence[str] = (), nodes: int = 2, tasks_per_node: int = 2
) -> DemoJob:
    """Submit the demo (by default 2 nodes x 2 ranks, a checkpoint every 10 steps), tracked so the fixture cancels
    it."""
    run = f"e2e-{name}-{int(time.time() * 1000) % 10**9}"
    job_id = submit_demo(
        lab.layout,
        run,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        gpus_per_node=tasks_per_node,
        steps=100000,
        checkpoint_every=10,
        extra_sbatch_args=extra_sbatch_args,
        env=lab.slurm_env,
    )
    return DemoJob(lab, run, lab.track(job_id))


# ----- Slurm's own word -------------------------------------------------------------------------------------------
def scheduler(lab: LabHandle) -> SlurmCliScheduler:
    return SlurmCliScheduler(env=lab.slurm_env, bin_dir=None, timeout_s=15)


async def slurm_job(lab: LabHandle, job_id: int) -> SlurmJob:
    job = await scheduler(lab).get_job(job_id)
    assert job is not None, f"Slurm does not list job {job_id}"
    return job


def sinfo_drains(lab: LabHandle) -> dict[str, str]:
    """A fresh ``sinfo``: every drained (or draining) node with its reason."""
    out = lab.slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E")
    drained: dict[str, str] = {}
    for line in out.splitlines():
        node, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if "drain" in state or "drng" in state:
            drained[node] = reason
    return drained


@dataclass
class CtldLog:
    """slurmctld's log from a mark on: what the controller itself says it was asked to do."""

    path: Path
    offset: int = 0

    @classmethod
    def mark(cls, lab: LabHandle) -> CtldLog:
        path = lab.layout.log / "slurmctld.log"
        return cls(path, path.stat().st_size if path.exists() else 0)

    def new_lines(self) -> list[str]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace").splitlines()

    def drains(self) -> list[tuple[str, str]]:
        """``(node, reason)`` of every drain reason set since the mark."""
        return [(m.group(1), m.group(2)) for line in self.new_lines() if (m := CTLD_REASON.search(line))]

    def requeues(self, job_id: int) -> int:
        return sum(1 for line in self.new_lines() if (m := CTLD_REQUEUE.search(line)) and int(m.group(1)) == job_id)


# ----- the workflow -----------------------------------------------------------------------------------------------
@dataclass
class Recovery:
    """The JobRecovery workflow of one demo job, seen through its ``status`` query."""

    lab: LabHandle
    client: Client
    job: DemoJob
    last: JobRecoveryStatus | None = None
    seen_states: list[RecoveryState] = field(default_factory=list)

    @property
    def workflow_id(self) -> str:
        return job_workflow_id(self.lab.cfg.cluster_name, self.job.job_id)

    async def query(self) -> JobRecoveryStatus | None:
        """The status, or None when there is no answer yet (no workflow, no live worker, Temporal down)."""
        handle = self.client.get_workflow_handle(self.workflow_id)
        try:
            st = await asyncio.wait_for(handle.query(JobRecoveryWorkflow.status), timeout=QUERY_TIMEOUT_S)
        except TimeoutError:
            return None
        except RPCError as e:
            if e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                return None
            if "no poller" in str(e).lower() or "not found" in str(e).lower():
                return None
            raise
        self.last = st
        if not self.seen_states or self.seen_states[-1] is not st.state:
            self.seen_states.append(st.state)
        return st

    async def wait(
        self, predicate: Callable[[JobRecoveryStatus], bool], timeout_s: float, what: str, interval_s: float = 0.2
    ) -> JobRecoveryStatus:
        """Poll the status until ``predicate`` holds; fail naming ``what`` with the last timeline on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = await self.query()
            if st is not None and predicate(st):
                return st
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last status:\n{self.describe()}")
            await asyncio.sleep(interval_s)

    async def wait_watching(self, timeout_s: float = 30) -> JobRecoveryStatus:
        """The workflow exists (ClusterWatch started it from the job's comment) and watches the running job."""
        return await self.wait(
            lambda s: s.state is RecoveryState.WATCHING and s.job_state is JobState.RUNNING,
            timeout_s,
            f"JobRecovery of job {self.job.job_id} watching it",
        )

    async def wait_resumed(self, incident: int = 1, timeout_s: float = 60) -> JobRecoveryStatus:
        return await self.wait(
            lambda s: (inc := incident_of(s, incident)) is not None and inc.resumed_at is not None,
            timeout_s,
            f"incident {incident} resumed",
        )

    async def wait_timeline(self, event: str, contains: str = "", timeout_s: float = 60) -> JobRecoveryStatus:
        return await self.wait(
            lambda s: any(e.event == event and contains in e.detail for e in s.timeline),
            timeout_s,
            f"timeline entry {event} {contains!r}",
            interval_s=0.1,
        )

    async def retire(self) -> None:
        """End the test's job without a recovery: terminate the workflow first, then cancel the job.

        Cancelling a watched job makes its ranks die with "Terminated", which the workflow may treat as an
        incident (and, seen once, drain a healthy node before noticing the cancel): a later test must not
        inherit that.
        """
        handle = self.client.get_workflow_handle(self.workflow_id)
        with contextlib.suppress(RPCError):
            await handle.terminate(reason="end of e2e test")
        self.lab.slurm("scancel", str(self.job.job_id), check=False)

    def describe(self) -> str:
        st = self.last
        if st is None:
            return "(no status ever answered)"
        out = [f"state {st.state.value}, job {st.job_state}, nodes {st.nodes}, restarts {st.restart_count}"]
        out += [f"  {e.at:%H:%M:%S.%f} {e.event:<10} #{e.incident or '-'} {e.detail}" for e in st.timeline]
        for inc in st.incidents:
            out.append(f"  incident {inc.id}: {inc.model_dump_json(exclude={'anomaly'})[:1500]}")
        return "\n".join(out)


def incident_of(st: JobRecoveryStatus, number: int = 1) -> Incident | None:
    return next((i for i in st.incidents if i.number == number), None)


def actions_of(incident: Incident, kind: ActionKind) -> list[str]:
    return [a.target for a in incident.actions if a.kind is kind]


async def settle_leftovers(lab: LabHandle, client: Client, timeout_s: float = 40) -> None:
    """Let earlier tests' recoveries end, then lift the drains they left.

    An earlier test's cleanup cancels its job while the job's JobRecovery still runs; that workflow may still
    drain a node seconds later (see ``Recovery.retire``). Wait for every JobRecovery whose job is no longer
    active to end (terminate it after ``timeout_s``), then resume every node drained with Rebound's reason.
    """
    prefix = job_workflow_id(lab.cfg.cluster_name, 0)[:-1]
    deadline = time.monotonic() + timeout_s
    while True:
        active = {j.job_id for j in await scheduler(lab).list_jobs() if j.state in (JobState.PENDING, JobState.RUNNING)}
        leftovers = [
            wf.id
            async for wf in client.list_workflows('WorkflowType = "JobRecovery" AND ExecutionStatus = "Running"')
            if wf.id.startswith(prefix) and wf.id[len(prefix) :].isdigit() and int(wf.id[len(prefix) :]) not in active
        ]
        if not leftovers:
            break
        if time.monotonic() >= deadline:
            for wf_id in leftovers:
                with contextlib.suppress(RPCError):
                    await client.get_workflow_handle(wf_id).terminate(reason="left over by an earlier e2e test")
            break
        await asyncio.sleep(0.5)
    for node, reason in sinfo_drains(lab).items():
        if reason.startswith(DRAIN_PREFIX.strip()):
            lab.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    # The earlier tests' recoveries have ended: none can ask the old Fleet anything now, so this test's Fleet is
    # new (closed breaker, no suspicions) whatever those recoveries did after the fixture's own reset.
    await end_fleet(lab, "earlier tests settled")


@contextlib.asynccontextmanager
async def monitored_demo(
    lab: LabHandle, name: str, *, extra_sbatch_args: Sequence[str] = (), checkpoint: bool = True
) -> AsyncIterator[tuple[DemoJob, Recovery]]:
    """A demo job that Rebound watches and (with ``checkpoint``) that has a checkpoint to resume from; retired
    at the end."""
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)
    job = submit_tracked_demo(lab, name, extra_sbatch_args=extra_sbatch_args)
    rec = Recovery(lab, client, job)
    try:
        await rec.wait_watching(timeout_s=30)
        if checkpoint:
            lab.wait_for(job.has_checkpoint, 60)
        yield job, rec
    finally:
        await rec.retire()


# ----- asserting one recovery -------------------------------------------------------------------------------------
@dataclass
class Baseline:
    """What was true before the fault: the job's restart count and where it ran."""

    restart_count: int
    nodes: tuple[str, ...]
    ctld: CtldLog


async def baseline(lab: LabHandle, job: DemoJob) -> Baseline:
    before = await slurm_job(lab, job.job_id)
    assert before.state is JobState.RUNNING and len(before.nodes) == 2, before
    assert not sinfo_drains(lab), f"a node is drained before the test: {sinfo_drains(lab)}"
    return Baseline(before.restart_count, before.nodes, CtldLog.mark(lab))


async def assert_recovered_once(
    lab: LabHandle, rec: Recovery, base: Baseline, bad_node: str, *, drained: bool = True
) -> Incident:
    """One incident, attributed to ``bad_node``, one verified drain of it (with ``drained``; without: no drain at
    all, the node only excluded from the job's next placement), one verified requeue excluding it, the successor
    resumed from a checkpoint elsewhere: by the workflow's record and by Slurm's and the job's."""
    st = rec.last
    assert st is not None
    assert len(st.incidents) == 1, rec.describe()
    inc = st.incidents[0]
    att = inc.attribution
    assert att is not None, rec.describe()
    assert att.implicated_nodes == (bad_node,), f"implicated {att.implicated_nodes}, truth {bad_node}\n{rec.describe()}"

    # The workflow's record: one drain of the bad node (or none), one requeue, each verified.
    assert actions_of(inc, ActionKind.DRAIN) == ([bad_node] if drained else []), rec.describe()
    assert actions_of(inc, ActionKind.REQUEUE) == [str(rec.job.job_id)], rec.describe()
    assert all(a.verified_at is not None for a in inc.actions), rec.describe()
    assert len({a.key for a in inc.actions}) == (2 if drained else 1)
    assert inc.detected_at and inc.restarted_at and inc.resumed_at, rec.describe()
    assert inc.detected_at <= inc.restarted_at <= inc.resumed_at
    assert inc.resumed_from.startswith("step_"), inc.resumed_from

    # Slurm's word: a fresh sinfo shows exactly that node drained, with Rebound's reason naming the incident (or
    # nothing drained at all).
    drains = sinfo_drains(lab)
    if drained:
        assert set(drains) == {bad_node}, f"drained now: {drains}"
        assert drains[bad_node].startswith(f"{DRAIN_PREFIX}{inc.id} "), drains
        assert base.ctld.drains() == [(bad_node, drains[bad_node])], f"slurmctld drains: {base.ctld.drains()}"
    else:
        assert not drains, f"drained now: {drains}"
        assert base.ctld.drains() == [], f"slurmctld drains: {base.ctld.drains()}"
    assert base.ctld.requeues(rec.job.job_id) == 1, "slurmctld requeued the job more or less than once"

    job = await slurm_job(lab, rec.job.job_id)
    assert job.restart_count == base.restart_count + 1, f"restarts {base.restart_count} -> {job.restart_count}"
    assert bad_node in job.excluded_nodes, f"excluded {job.excluded_nodes}"
    assert job.nodes and bad_node not in job.nodes, f"the successor runs on {job.nodes}"

    # The job's word: the successor loaded a checkpoint and trained, on other nodes.
    resumed = rec.job.resumed_and_stepped(job.restart_count)
    assert resumed is not None, f"rank 0 did not log a resume and a step in attempt {job.restart_count}"
    ran_on = rec.job.nodes_logged(job.restart_count)
    assert ran_on and bad_node not in ran_on, f"the successor trained on {ran_on}"
    return inc


def latency_report(name: str, st: JobRecoveryStatus, inc: Incident, t0_epoch: float) -> str:
    """Seconds after the true fault onset t0: detection (``detected_at``, the anomaly's own observation time),
    the DETECTED entry of the workflow's timeline (when the workflow acted on it), the verified recovery action
    and the first training step after the resume."""

    def after(at: datetime | None) -> str:
        return f"{at.timestamp() - t0_epoch:.2f} s" if at else "-"

    entry = next((e.at for e in st.timeline if e.event == "DETECTED" and e.incident == inc.number), None)
    cause = inc.attribution.cause if inc.attribution else "?"
    return (
        f"\n[{name}] {cause}: detection latency {after(inc.detected_at)} (detected_at - t0); workflow DETECTED "
        f"{after(entry)}; action verified {after(inc.restarted_at)}; resumed {after(inc.resumed_at)}"
    )


# ----- the worker -------------------------------------------------------------------------------------------------
def worker_pid(lab: LabHandle) -> int:
    pid = lab.lab.rebound.pid("worker")
    assert pid is not None, "the test lab's worker is not running"
    return pid


def sigkill_worker(lab: LabHandle) -> int:
    """SIGKILL the worker process only (its children, e.g. a running scontrol, live on, as after a crash)."""
    pid = int(lab.layout.pid_file("worker").read_text().split()[0])
    assert pid == worker_pid(lab)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_alive(pid)
    return pid


def wait_for_worker_command(lab: LabHandle, *words: str, timeout_s: float = 10) -> list[str]:
    """Wait until the worker runs a command (a child process) whose arguments include every one of ``words``;
    returns its command line. With the slow ``scontrol``, that command is in flight for seconds."""
    pid = worker_pid(lab)
    deadline = time.monotonic() + timeout_s
    while True:
        for child in descendants([pid]):
            argv = cmdline(child)
            if all(any(w == a or a.endswith(f"/{w}") for a in argv) for w in words):
                return argv
        if time.monotonic() >= deadline:
            raise AssertionError(f"the worker ran no {' '.join(words)!r} within {timeout_s:.0f} s")
        time.sleep(0.02)


def stop_worker(lab: LabHandle) -> None:
    """SIGTERM the worker (graceful: no sticky-queue delay for the next one) and forget its pid file."""
    pid = lab.lab.rebound.pid("worker")
    if pid is not None:
        kill_and_wait([pid], term_timeout_s=15)
    lab.layout.pid_file("worker").unlink(missing_ok=True)


def write_slow_slurm_bin(bin_dir: Path, delay_s: float) -> Path:
    """A Slurm bin dir whose ``scontrol`` sleeps ``delay_s`` first; the other commands are the real ones."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    real = lab_binary("scontrol")
    wrapper = bin_dir / "scontrol"
    wrapper.write_text(f'#!/bin/sh\nsleep {delay_s:g}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    for tool in ("squeue", "sinfo", "sbatch", "scancel"):
        link = bin_dir / tool
        link.unlink(missing_ok=True)
        link.symlink_to(lab_binary(tool))
    return bin_dir


def lab_binary(tool: str) -> str:
    from deploy.local.system import find_binary

    found = find_binary(tool)
    assert found is not None, f"{tool} is not installed"
    return found


def start_worker_with(lab: LabHandle, extra_env: dict[str, str]) -> int:
    """Replace the lab's worker by one with extra settings (same log and pid file, so the lab still owns it)."""
    stop_worker(lab)
    services = lab.lab.rebound
    spawn(
        [sys.executable, "-m", "workers.cli", "worker"],
        log_file=lab.layout.log_file("worker"),
        pid_file=lab.layout.pid_file("worker"),
        env={**services.common_env(), **extra_env},
    )
    services.start()  # starts nothing more; waits until the new worker polls
    return worker_pid(lab)


@contextlib.contextmanager
def slow_scontrol_worker(lab: LabHandle, tmp: Path, delay_s: float = 3.0) -> Iterator[int]:
    """The lab's worker, with every ``scontrol`` taking ``delay_s`` longer; the normal worker is back after."""
    bin_dir = write_slow_slurm_bin(tmp / "slow-slurm-bin", delay_s)
    try:
        yield start_worker_with(lab, {"REBOUND_SLURM__BIN_DIR": str(bin_dir)})
    finally:
        stop_worker(lab)
        lab.lab.rebound.start()


def worker_is_normal(lab: LabHandle) -> bool:
    """True when the running worker has no Slurm bin-dir override (what every other test expects)."""
    pid = lab.lab.rebound.pid("worker")
    if pid is None:
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return not any(item.startswith(b"REBOUND_SLURM__BIN_DIR=") for item in environ)


def worker_log_mark(lab: LabHandle) -> int:
    path = lab.layout.log_file("worker")
    return path.stat().st_size if path.exists() else 0


def worker_log_since(lab: LabHandle, offset: int) -> list[str]:
    with lab.layout.log_file("worker").open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()
