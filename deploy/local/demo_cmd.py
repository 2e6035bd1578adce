"""``rebound lab demo`` (what `make demo` runs): bring the lab up, train a real job, break it, watch Rebound
recover it.

1. The lab comes up (Temporal, Slurm with 4 GPU nodes, node agents, the Rebound worker).
2. The demo job (torch.distributed, 2 nodes x 2 ranks) is submitted, opted in through ``--comment``; Rebound's
   ClusterWatch finds it and starts its JobRecovery workflow.
3. Once it trains and has a checkpoint, one GPU of its second node raises XID 79 and its rank dies with a CUDA
   error. Rebound detects it, drains the node, requeues the job without it and waits until it trains again.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from pathlib import Path

from deploy.local.lab import Lab, format_status
from deploy.local.processes import LabError, run
from workers.settings import Settings
from workflows.constants import is_rebound_drain
from workflows.domain.recovery import JobRecoveryStatus

FOLLOW_S = 45.0
RECOVERY_TIMEOUT_S = 150.0


def lab_settings(lab: Lab) -> Settings:
    """Rebound settings pointing at this lab (what the lab's own worker gets through its environment)."""
    cfg = lab.cfg
    return Settings(
        cluster_name=cfg.cluster_name,
        state_dir=cfg.state_dir,
        temporal={"address": cfg.temporal_address, "namespace": cfg.temporal_namespace},
        slurm={"slurm_conf": cfg.layout.slurm_conf},
        auth={"munge_socket": cfg.layout.munge_socket},
    )


def run_demo(lab: Lab, *, break_it: bool = True) -> int:
    """The whole demo; returns 0 when the job trained, was broken, and trained again."""
    from deploy.demo.submit import submit_demo

    took = lab.up()
    print(format_status(lab.status()))
    print(f"lab is up in {took:.1f} s\n")
    _fresh_start(lab)
    settings = lab_settings(lab)
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    job_id = submit_demo(lab.cfg.layout, run_name, steps=1_000_000, checkpoint_every=20, env=lab.slurm.env())
    print(f"submitted demo training job {job_id} (run {run_name}): 2 nodes x 2 ranks, torch.distributed/gloo,")
    print("opted in to Rebound with sbatch --comment 'rebound: ckpt=...;logs=...'\n")
    log = lab.cfg.layout.run_dir(run_name) / "logs" / f"job-{job_id}-rank-0.log"
    offset = _follow(lab, log, job_id, until=lambda line: "saved checkpoint" in line, timeout_s=FOLLOW_S)
    asyncio.run(_wait_monitored(settings, job_id))
    wf = urllib.parse.quote(f"rebound/{lab.cfg.cluster_name}/job/{job_id}", safe="")
    ui = f"{lab.cfg.temporal_ui_url}/namespaces/{lab.cfg.temporal_namespace}/workflows/{wf}"
    ok = True
    if break_it:
        ok = _break_and_recover(lab, settings, run_name, job_id, log, offset)
    print(
        f"\n  Temporal Web UI:  {ui}\n"
        f"  follow training:  tail -f {log}\n"
        f"  the timeline:     .venv/bin/rebound timeline {job_id}   (after: source {lab.cfg.layout.env_file})\n"
        f"  break it again:   .venv/bin/rebound lab inject crash --run {run_name} --rank 1\n"
        f"  tear down:        make down\n"
    )
    return 0 if ok else 1


def _break_and_recover(lab: Lab, settings: Settings, run_name: str, job_id: int, log: Path, offset: int) -> bool:
    from deploy.demo.inject import inject
    from workers import jobs_cli

    print("\n*** breaking it: XID 79 (GPU fell off the bus) on the GPU of rank 2, on the job's second node ***")
    record = inject(lab.cfg.layout, "gpu-fault", run=run_name, rank=2)
    print(f"  injected at {record.t0:%H:%M:%S.%f} on {record.node} GPU {record.gpu}\n")
    status = asyncio.run(_watch_recovery(settings, job_id, record.t0.timestamp()))
    if status is None:
        print(
            f"  Rebound did not finish the recovery within {RECOVERY_TIMEOUT_S:.0f} s: see `rebound timeline {job_id}`"
        )
        return False
    print("\n" + jobs_cli.render_timeline(status))
    print("\n$ sinfo -R   (the node Rebound drained, with its reason)")
    print(run(["sinfo", "-R"], env=lab.slurm.env()).rstrip())
    print(f"\ntraining again ({log.name}):")
    steps_after_resume: list[str] = []
    resumed = [False]

    def enough(line: str) -> bool:
        resumed[0] = resumed[0] or "resumed from" in line
        if resumed[0] and "step=" in line:
            steps_after_resume.append(line)
        return len(steps_after_resume) >= 6

    _follow(lab, log, job_id, until=enough, timeout_s=6.0, start=offset, only_after="resumed from")
    return True


async def _wait_monitored(settings: Settings, job_id: int) -> None:
    """Wait until ClusterWatch has started the job's workflow (about a second)."""
    from workers import jobs_cli
    from workers.client import connect
    from workflows.domain.errors import ReboundError

    client = await connect(settings.temporal)
    deadline = time.monotonic() + 30
    while True:
        try:
            st = await jobs_cli.query_status(client, settings, job_id)
            print(f"Rebound is monitoring job {job_id}: {st.state.value}")
            return
        except ReboundError:
            if time.monotonic() > deadline:
                raise LabError(f"Rebound did not pick up job {job_id} within 30 s: see the worker log") from None
            await asyncio.sleep(0.5)


async def _watch_recovery(settings: Settings, job_id: int, t0: float) -> JobRecoveryStatus | None:
    """Print each state change until the incident is resumed; returns the final status (None on timeout)."""
    from workers import jobs_cli
    from workers.client import connect

    client = await connect(settings.temporal)
    seen = 0
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        st = await jobs_cli.query_status(client, settings, job_id)
        for e in st.timeline[seen:]:
            print(f"  +{e.at.timestamp() - t0:6.2f}s  {e.event:<10} {e.detail[:110]}")
        seen = len(st.timeline)
        if st.incidents and st.incidents[-1].resumed_at is not None:
            return st
        if st.state.is_terminal():
            return None
        await asyncio.sleep(0.3)
    return None


def _fresh_start(lab: Lab) -> None:
    """Healthy GPUs everywhere, and no node still drained by an earlier demo (only Rebound's own drains)."""
    for node in lab.cfg.node_names:
        lab.rebound.reset_gpus(node)
    out = run(["sinfo", "-h", "-N", "-o", "%N|%E"], env=lab.slurm.env())
    for line in out.splitlines():
        node, _, reason = line.partition("|")
        if is_rebound_drain(reason):
            run(["scontrol", "update", f"nodename={node}", "state=resume"], env=lab.slurm.env())
            print(f"released {node} (drained by an earlier demo: {reason})")
    asyncio.run(_reset_fleet(lab))


async def _reset_fleet(lab: Lab) -> None:
    """As the lab's operator: reset the breaker (a demo within the hour of an earlier one would otherwise be held
    for approval at the cap) and reject what an earlier demo left pending."""
    from temporalio.service import RPCError

    from workers.client import connect
    from workers.fleet_cli import fleet_status, reset_breaker
    from workflows.domain.errors import ReboundError

    settings = lab_settings(lab)
    try:
        client = await connect(settings.temporal)
        await reset_breaker(client, settings)
        st = await fleet_status(client, settings)
    except (ReboundError, RPCError):
        return  # no Fleet yet: the first request of this demo starts it
    pending = [a.id for a in st.state.approvals if a.outcome.value == "pending"]
    if pending:
        print(f"earlier demos left approvals pending ({', '.join(pending)}): `rebound reject ID` clears them")


def _follow(
    lab: Lab,
    log: Path,
    job_id: int,
    *,
    until: object,
    timeout_s: float,
    start: int = 0,
    only_after: str = "",
) -> int:
    """Print rank 0's interesting lines as they come until ``until(line)``; returns the offset reached."""
    assert callable(until)
    deadline = time.monotonic() + timeout_s
    offset, showing = start, not only_after
    print(f"following {log}:")
    while time.monotonic() < deadline:
        _check_job_alive(lab, job_id)
        offset, lines = _read_new(log, offset)
        for line in lines:
            showing = showing or only_after in line
            if showing and any(k in line for k in ("step=", "checkpoint", "resum", "process group")):
                print("  " + line)
            if until(line):
                return offset
        time.sleep(0.3)
    return offset


def _read_new(path: Path, offset: int) -> tuple[int, list[str]]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset, []
    complete = data[: data.rfind(b"\n") + 1]
    return offset + len(complete), complete.decode(errors="replace").splitlines()


def _check_job_alive(lab: Lab, job_id: int) -> None:
    out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T %R"], env=lab.slurm.env(), timeout=10).strip()
    state = out.split()[0] if out else "GONE"
    if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        raise LabError(f"demo job {job_id} is {state} ({out}); see {lab.cfg.layout.runs}")
