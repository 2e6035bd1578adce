"""The lab's HealthCheckProgram (an NHC stand-in) and the node check's fault wrapper, run for real without Slurm:
``scontrol`` is a stub that records its arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local.node_check_lab import check_command, fail_check, fail_nhc, health_check_script, main


def _stub_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    calls = tmp_path / "calls"
    stub = tmp_path / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "SLURM_CONF=$SLURM_CONF" "$@" >> {calls}\n')
    stub.chmod(0o755)
    return stub, calls


def _script(tmp_path: Path) -> tuple[Path, Path]:
    stub, calls = _stub_scontrol(tmp_path)
    script = tmp_path / "healthcheck.sh"
    script.write_text(health_check_script(tmp_path, str(stub), tmp_path / "slurm.conf"))
    script.chmod(0o755)
    return script, calls


def test_nhc_drains_the_flagged_node_with_its_text(tmp_path: Path) -> None:
    script, calls = _script(tmp_path)
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n2"}
    subprocess.run(["sh", str(script)], env=env, check=True)
    assert not calls.exists()  # no flag: nothing
    fail_nhc(tmp_path, "n2", "lab: bad DIMM")
    subprocess.run(["sh", str(script)], env=env, check=True)
    line = calls.read_text().strip()
    assert line == f"SLURM_CONF={tmp_path / 'slurm.conf'} update nodename=n2 state=drain reason=NHC: lab: bad DIMM"
    fail_nhc(tmp_path, "n2", None)
    subprocess.run(["sh", str(script)], env=env, check=True)
    assert len(calls.read_text().splitlines()) == 1


def test_nhc_finds_its_node_from_the_parent_slurmd_arguments(tmp_path: Path) -> None:
    script, calls = _script(tmp_path)
    fail_nhc(tmp_path, "n3", "x")
    # The parent stands in for `slurmd -f slurm.conf -N n3` (several slurmd share the lab's host).
    parent = "import subprocess, sys; subprocess.run(['sh', sys.argv[1]], env={'PATH': '/usr/bin:/bin'}, check=True)"
    subprocess.run([sys.executable, "-c", parent, str(script), "-f", "x", "-N", "n3"], check=True)
    assert "nodename=n3" in calls.read_text()


@pytest.mark.parametrize(("rank", "expected"), [("1", 1), ("0", None)])
def test_the_wrapper_fails_only_the_flagged_nodes_last_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str, expected: int | None
) -> None:
    fail_check(tmp_path, "n3", "exit")
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    monkeypatch.setenv("SLURM_PROCID", rank)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda f, a: execs.append(a))
    flags = str(tmp_path / "faults" / "node-check")
    assert main([flags, "--", "probe", "--timeout-s", "5"]) == expected
    assert execs == ([] if expected else [["probe", "--timeout-s", "5"]])


def test_check_command_runs_the_probe_through_the_wrapper(tmp_path: Path) -> None:
    cmd = check_command(tmp_path)
    assert cmd[1:3] == ["-m", "deploy.local.node_check_lab"] and cmd[-2:] == ["-m", "activities.node_check.probe"]
