"""The test lab: a second lab beside the demo's, with its own state directory and ports.

`make test` never touches a running `make demo` lab: the test lab lives in ``.rebound-lab-test`` and listens
on other ports. The pytest session brings it up (idempotently) and takes it down at the end unless
``REBOUND_KEEP_LAB=1``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.service import RPCError

from deploy.local.config import LabConfig
from deploy.local.demo_cmd import lab_settings
from deploy.local.lab import Lab
from deploy.local.layout import LabLayout
from workers.client import connect
from workers.settings import Settings
from workflows.constants import fleet_workflow_id

REPO = Path(__file__).resolve().parent.parent


#: ``make test`` runs the lab tests on two test labs side by side (deploy/local/test-all.sh): most of a lab test's
#: time is waiting on real daemons, so two labs halve the wall time on a 2-core machine. Each slot is a whole lab,
#: its own state directory, cluster name (the node agents tell the two labs' ranks apart by it) and ports.
LAB_SLOT_ENV = "REBOUND_TEST_LAB_SLOT"
_SLOT_PORT_STEP = 20  # the next slot's ports: clear of the demo lab's (68xx, 72xx, 170xx) and the first slot's


def test_lab_config() -> LabConfig:
    slot = int(os.environ.get(LAB_SLOT_ENV, "0"))
    if slot not in (0, 1):
        raise ValueError(f"{LAB_SLOT_ENV}={slot}: the test labs are slots 0 and 1")
    step = _SLOT_PORT_STEP * slot
    default_dir = REPO / (".rebound-lab-test" if slot == 0 else f".rebound-lab-test-{slot + 1}")
    return LabConfig(
        state_dir=Path(os.environ.get("REBOUND_TEST_LAB_DIR", default_dir)),
        cluster_name="labtest" if slot == 0 else f"labtest{slot + 1}",
        slurmctld_port=6827 + step,
        slurmd_port_base=17011 + step,
        slurmrestd_port=6830 + step,
        temporal_port=7243 + step,
        temporal_ui_port=8243 + step,
        temporal_tls_port=7244 + step,
        slurmrestd_tls_port=6831 + step,
        demo_port_slot=slot,
    )


@dataclass
class LabHandle:
    """What e2e tests get: the running lab and helpers to use it."""

    lab: Lab
    submitted: list[int] = field(default_factory=list)

    @property
    def cfg(self) -> LabConfig:
        return self.lab.cfg

    @property
    def layout(self) -> LabLayout:
        return self.lab.cfg.layout

    @property
    def slurm_env(self) -> dict[str, str]:
        return self.lab.slurm.env()

    @property
    def rest_socket(self) -> Path:
        return self.layout.rest_socket

    @property
    def rest_url(self) -> str:
        return self.cfg.slurmrestd_url

    @property
    def nodes(self) -> list[str]:
        return self.cfg.node_names

    @property
    def temporal_address(self) -> str:
        return self.cfg.temporal_address

    def jwt_token(self) -> str:
        return self.lab.slurm.token()

    def slurm(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm command against the lab; returns stdout."""
        done = subprocess.run(list(argv), env=self.slurm_env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv} failed: {done.stderr}")
        return done.stdout

    def submit_sleep_job(self, nodes: int = 2, requeue: bool = True, extra_args: Sequence[str] = ()) -> int:
        """Submit a job whose step sleeps on every node; returns its id (cancelled after the test)."""
        out_dir = self.layout.runs / "sleep"
        out_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "sbatch", "--parsable", f"-N{nodes}", "--ntasks-per-node=1", "--gres=gpu:1", "-J", "sleeper",
            f"--output={out_dir}/sleep-%j.out", "--requeue" if requeue else "--no-requeue", *extra_args,
            "--wrap", "srun sleep 600",
        ]  # fmt: skip
        job_id = int(self.slurm(*argv).strip().split(";")[0])
        self.submitted.append(job_id)
        return job_id

    def track(self, job_id: int) -> int:
        """Cancel this job when the test ends."""
        self.submitted.append(job_id)
        return job_id

    def wait_for(self, predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> object:
        """Poll until ``predicate()`` is truthy; returns its value or fails the test on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"condition not met within {timeout_s} s")
            time.sleep(interval_s)

    def cleanup(self) -> None:
        """Cancel the test's jobs and resume drained nodes (every drain in the test lab is a test's own)."""
        if self.submitted:
            self.slurm("scancel", *[str(j) for j in self.submitted], check=False)
            self.submitted.clear()
        for node, state in self.lab.slurm.node_states().items():
            if "drain" in state or "drng" in state or state.startswith("down"):
                self.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def lab_rebound_settings(handle: LabHandle) -> Settings:
    """Settings of a Rebound client talking to the test lab (what its worker gets)."""
    return lab_settings(handle.lab)


async def end_fleet(handle: LabHandle, reason: str) -> None:
    """End the lab's Fleet workflow, if one runs; the next isolation request starts a new one (signal-with-start).

    Each e2e test starts with a Fleet that remembers nothing of earlier tests: no open breaker, no pending approval
    and no suspicion. A suspicion lasts ``suspicion_window_s`` (a day), so an earlier test's rank crash on n2 turned a
    later test's rank crash on n2 into "implicated again: drain" (CI, stop 18). A Fleet left by an earlier pytest
    session is ended too: it carries that session's code, and its history would not replay on changed code."""
    settings = lab_rebound_settings(handle)
    client = await connect(settings.temporal)
    with contextlib.suppress(RPCError):  # none running
        await client.get_workflow_handle(fleet_workflow_id(settings.cluster_name)).terminate(reason=reason)


def operator_env(handle: LabHandle) -> dict[str, str]:
    """What an operator's shell has after ``source $STATE/lab.env`` (the lab's own env file), and nothing else:
    the CLI signs each action with the lab's munged (``REBOUND_AUTH__MUNGE_SOCKET``)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    for line in handle.layout.env_file.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value.strip("'")
    return env
