"""The demo jobs' rendezvous ports (``deploy.demo.ports``): distinct per attempt, per job, per lab, per launcher."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy.demo.ports import GLOO, PORT_SLOT_ENV, TORCHRUN, PortRange, main, port_slot, rendezvous_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_port_depends_on_job_and_restart_and_stays_in_its_range() -> None:
    port0 = rendezvous_port(19, 0)
    assert rendezvous_port(19, 1) != port0 and rendezvous_port(20, 0) != port0
    assert all(20000 <= rendezvous_port(j, r) < 30000 for j in range(2000) for r in range(5))
    assert all(
        30000 <= rendezvous_port(j, r, s, TORCHRUN) < 32700 for j in range(2000) for r in range(8) for s in (0, 1)
    )


@pytest.mark.parametrize("ports", [GLOO, TORCHRUN])
def test_the_two_port_slots_never_share_a_port(ports: PortRange) -> None:
    """Two labs on one host number their jobs alike: the second lab's slot keeps their ports apart."""
    first = {rendezvous_port(j, r, 0, ports) for j in range(1, 700) for r in range(8)}
    second = {rendezvous_port(j, r, 1, ports) for j in range(1, 700) for r in range(8)}
    assert not first & second


def test_the_launchers_ranges_are_apart() -> None:
    gloo = {rendezvous_port(j, r, s) for j in range(1, 2000) for r in range(8) for s in (0, 1)}
    torchrun = {rendezvous_port(j, r, s, TORCHRUN) for j in range(1, 2000) for r in range(8) for s in (0, 1)}
    assert not gloo & torchrun


def test_the_slot_comes_from_the_environment() -> None:
    assert port_slot({}) == 0 and port_slot({PORT_SLOT_ENV: "1"}) == 1 and port_slot({PORT_SLOT_ENV: "x"}) == 0


def test_the_batch_script_asks_the_module_for_the_attempts_torchrun_port(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "3", PORT_SLOT_ENV: "1"}
    assert main(["torchrun"], env) == 0
    assert capsys.readouterr().out == f"{rendezvous_port(12, 3, 1, TORCHRUN)}\n"
    assert main(["torchrun"], {}) == 2 and "usage" in capsys.readouterr().err


def test_the_module_runs_without_torch() -> None:
    """The batch script runs it before any torch import; it must not pull torch in (seconds per attempt)."""
    code = "import sys, runpy; runpy.run_module('deploy.demo.ports'); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
