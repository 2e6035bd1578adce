"""``rebound lab demo`` (what `make demo` runs): lab up, demo job submitted and monitored, training shown."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from pathlib import Path

from deploy.local.lab import Lab, format_status
from deploy.local.processes import LabError, run
from workers.settings import Settings


def lab_settings(lab: Lab) -> Settings:
    """Rebound settings pointing at this lab (what the lab's own worker gets through its environment)."""
    cfg = lab.cfg
    return Settings(
        cluster_name=cfg.cluster_name,
        state_dir=cfg.state_dir,
        temporal={"address": cfg.temporal_address, "namespace": cfg.temporal_namespace},
        slurm={"slurm_conf": cfg.layout.slurm_conf},
    )


def run_demo(lab: Lab, *, follow_s: float = 45.0, min_steps: int = 10) -> int:
    """Bring everything up, submit and monitor the demo job, and show it training."""
    from deploy.demo.submit import submit_demo
    from workers import jobs_cli

    took = lab.up()
    print(format_status(lab.status()))
    print(f"lab is up in {took:.1f} s\n")
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    job_id = submit_demo(lab.cfg.layout, run_name, steps=1_000_000, env=lab.slurm.env())
    print(f"submitted demo training job {job_id} (run {run_name}): 2 nodes x 2 ranks, torch.distributed/gloo")
    settings = lab_settings(lab)
    asyncio.run(jobs_cli.watch(settings, job_id, poll_interval_s=2.0))
    steps = _follow(lab, run_name, job_id, follow_s=follow_s, min_steps=min_steps)
    wf = urllib.parse.quote(f"rebound/{lab.cfg.cluster_name}/job/{job_id}", safe="")
    print(
        f"\nThe job is training ({steps} step lines shown). It keeps going until you stop it.\n"
        f"  Temporal Web UI:  {lab.cfg.temporal_ui_url}/namespaces/{lab.cfg.temporal_namespace}/workflows/{wf}\n"
        f"  follow training:  tail -f {lab.cfg.layout.run_dir(run_name)}/logs/job-{job_id}-rank-0.log\n"
        f"  recovery status:  .venv/bin/rebound status {job_id}   (after: source {lab.cfg.layout.env_file})\n"
        f"  break it:         .venv/bin/rebound lab inject crash --run {run_name} --rank 1\n"
        f"  tear down:        make down\n"
    )
    return 0 if steps >= min_steps else 1


def _follow(lab: Lab, run_name: str, job_id: int, *, follow_s: float, min_steps: int) -> int:
    """Print rank 0's step lines as they come, until ``min_steps`` were shown or ``follow_s`` passed."""
    log = lab.cfg.layout.run_dir(run_name) / "logs" / f"job-{job_id}-rank-0.log"
    deadline = time.monotonic() + follow_s
    offset, shown = 0, 0
    print(f"following {log}:")
    while time.monotonic() < deadline and shown < min_steps:
        _check_job_alive(lab, job_id)
        offset, lines = _read_new(log, offset)
        for line in lines:
            if "step=" in line or "checkpoint" in line or "resum" in line or "world" in line:
                print("  " + line)
                shown += "step=" in line
        time.sleep(0.5)
    return shown


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
