"""The lab's real-trainer jobs: submission picks their batch scripts, the scripts launch them one srun task per
rank, and each job resumes from its own checkpoint on a restart (one rank, no Slurm: srun's variables by hand).
The job runs need the trainers extra and are skipped without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.demo import submit
from deploy.demo.common import RankEnv, RunPaths
from deploy.demo.faults import FaultState, FaultWatcher
from deploy.demo.real_trainers import RankSetup
from deploy.local.layout import LabLayout
from tests.demo.conftest import free_port

FAKE_SRUN = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/srun-args"
"""


@pytest.mark.parametrize("trainer", ["lightning", "hf"])
def test_submission_and_batch_script_launch_the_trainer(tmp_path: Path, trainer: str) -> None:
    cmd = submit.sbatch_command(LabLayout(tmp_path / "lab"), "r1", trainer=trainer, steps=7)
    script = Path(cmd[cmd.index(str(submit.TRAINER_SCRIPTS[trainer]))])
    assert "--ntasks-per-node=2" in cmd and cmd[-6:] == [
        "--steps",
        "7",
        "--checkpoint-every",
        "20",
        "--step-sleep",
        "0.1",
    ]

    (tmp_path / "bin").mkdir()
    srun = tmp_path / "bin" / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    run_dir = tmp_path / "run"
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "REBOUND_PYTHON": sys.executable,
        "REBOUND_RUN_DIR": str(run_dir),
    }
    done = subprocess.run(["bash", str(script), "--steps", "7"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "srun-args").read_text().splitlines()
    assert args[:2] == ["--kill-on-bad-exit=1", f"--output={run_dir}/logs/job-%j-rank-%t.log"]
    assert args[args.index("-m") + 1] == f"deploy.demo.train_{trainer}"


def test_unknown_trainer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trainer"):
        submit.sbatch_command(LabLayout(tmp_path / "lab"), "r1", trainer="keras")


def _run(module: str, run_dir: Path, steps: int, restart: int) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(submit.REPO_ROOT),
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "n1",
        "SLURM_NODELIST": "n1",
        "SLURM_JOB_ID": str(4000 + os.getpid() % 1000),
        "SLURM_JOB_NAME": "rebound-test",
        "SLURM_RESTART_COUNT": str(restart),
    }
    # A port the OS says is free, not the one the trainer derives from the job id: that range is the labs' own
    # (make test runs two labs beside this suite), and a lab job's rank meeting this store kept it from exiting.
    env["MASTER_PORT"] = str(free_port())
    cmd = [sys.executable, "-m", module, "--run-dir", str(run_dir), "--steps", str(steps), "--checkpoint-every", "3"]
    cmd += ["--step-sleep", "0"]
    done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_lightning_job_resumes_from_last_ckpt_and_prints_nothing_per_step(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    first = _run("deploy.demo.train_lightning", tmp_path, steps=6, restart=0)
    assert {p.name for p in (tmp_path / "checkpoints").iterdir()} >= {"last.ckpt", "step=3.ckpt", "step=6.ckpt"}
    assert "Restored all states" not in first
    again = _run("deploy.demo.train_lightning", tmp_path, steps=9, restart=1)
    assert f"Restored all states from the checkpoint at {tmp_path / 'checkpoints' / 'last.ckpt'}" in again
    assert (tmp_path / "checkpoints" / "step=9.ckpt").is_file()
    # Silent without a terminal: no per-step line, no progress-bar frame, nothing that names a step.
    assert "\r" not in again and "step=" not in again.replace("step=9.ckpt", "").replace("`max_steps=9`", "")


@pytest.mark.slow
def test_hf_job_resumes_from_its_latest_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _run("deploy.demo.train_hf", tmp_path, steps=3, restart=0)
    again = _run("deploy.demo.train_hf", tmp_path, steps=5, restart=1)
    assert f"resuming from checkpoint {tmp_path / 'checkpoints' / 'checkpoint-3'}" in again
    assert {p.name for p in (tmp_path / "checkpoints").iterdir()} == {"checkpoint-3", "checkpoint-5"}


class _Due(FaultWatcher):
    """The fault state the step's faults left, without a control directory."""

    def check(self, step: int) -> FaultState:
        return self.state


@pytest.mark.parametrize(
    ("state", "error"),
    [
        (FaultState(cuda_error="CUDA error: unspecified launch failure"), RuntimeError),
        (FaultState(corrupt_next_batch=True), ValueError),
    ],
)
def test_step_start_raises_the_injected_errors(tmp_path: Path, state: FaultState, error: type[Exception]) -> None:
    env = RankEnv.from_environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURMD_NODENAME": "n1"})
    paths = RunPaths(tmp_path)
    setup = RankSetup(env=env, paths=paths, watcher=_Due(paths, env, state=state), step_sleep=0.0)
    with pytest.raises(error):
        setup.at_step_start(5)
    RankSetup(env=env, paths=paths, watcher=_Due(paths, env), step_sleep=0.0).at_step_start(5)  # nothing due
