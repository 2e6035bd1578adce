"""submit_demo against a fake sbatch, and train.sbatch run by bash against a fake srun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.demo import submit
from deploy.local.layout import LabLayout

# Records its arguments (one per line) and environment, then answers like `sbatch --parsable` does.
FAKE_SBATCH = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/args"
env > "$FAKE_DIR/env"
echo "4242;lab"
"""
FAKE_SRUN = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/srun-args"
exit "${FAKE_SRUN_RC:-0}"
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_submit_demo_calls_sbatch(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path / "lab")
    sbatch = _script(tmp_path / "sbatch", FAKE_SBATCH)
    env = {"PATH": os.environ["PATH"], "FAKE_DIR": str(tmp_path), "PYTHONPATH": "/elsewhere", "MASTER_PORT": "1"}

    job_id = submit.submit_demo(
        layout,
        "r1",
        steps=50,
        checkpoint_every=10,
        extra_sbatch_args=("--exclude=n2",),
        env=env,
        sbatch=str(sbatch),
    )

    assert job_id == 4242
    run_dir = layout.run_dir("r1")
    assert all((run_dir / d).is_dir() for d in ("logs", "checkpoints", "control", "ranks"))
    args = (tmp_path / "args").read_text().splitlines()
    script = args.index(str(submit.SBATCH_SCRIPT))
    options = args[:script]
    assert options[0] == "--parsable"
    for option in (
        "--job-name=rebound-demo-r1",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gres=gpu:2",
        "--requeue",
        f"--output={run_dir}/logs/job-%j-batch.log",
        f"--chdir={run_dir}",
        "--export=ALL",
        "--exclude=n2",
    ):
        assert option in options
    assert args[script + 1 :] == ["--steps", "50", "--checkpoint-every", "10", "--step-sleep", "0.1"]
    job_env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert job_env["SLURM_CONF"] == str(layout.slurm_conf)
    assert job_env["REBOUND_PYTHON"] == sys.executable
    assert job_env["REBOUND_RUN_DIR"] == str(run_dir)
    assert job_env["PYTHONPATH"] == f"{submit.REPO_ROOT}:/elsewhere"
    assert "MASTER_PORT" not in job_env


def test_submit_errors(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path / "lab")
    failing = _script(tmp_path / "sbatch", "#!/bin/sh\necho 'sbatch: error: Batch job submission failed' >&2\nexit 1\n")
    with pytest.raises(submit.SubmitError, match="Batch job submission failed"):
        submit.submit_demo(layout, "r1", env={}, sbatch=str(failing))
    with pytest.raises(submit.SubmitError, match="cannot run"):
        submit.submit_demo(layout, "r1", env={}, sbatch=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="invalid run name"):
        submit.submit_demo(layout, "../escape", env={})
    with pytest.raises(submit.SubmitError, match="no job id"):
        submit.parse_job_id("Submitted batch job\n")
    assert submit.parse_job_id("17\n") == 17


def _run_sbatch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _script(bin_dir / "srun", FAKE_SRUN)
    full = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path), "SLURM_JOB_ID": "9", **env}
    cmd = ["bash", str(submit.SBATCH_SCRIPT), *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=30, check=False)


def test_batch_script_runs_srun(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    env = {"REBOUND_PYTHON": sys.executable, "REBOUND_RUN_DIR": str(run_dir), "SLURM_RESTART_COUNT": "1"}
    done = _run_sbatch(tmp_path, env, "--steps", "5")
    assert done.returncode == 0, done.stderr
    assert all((run_dir / d).is_dir() for d in ("logs", "checkpoints", "control", "ranks"))
    assert (tmp_path / "srun-args").read_text().splitlines() == [
        "--kill-on-bad-exit=1",
        f"--output={run_dir}/logs/job-%j-rank-%t.log",
        "--open-mode=append",
        sys.executable,
        "-m",
        "deploy.demo.train",
        "--run-dir",
        str(run_dir),
        "--steps",
        "5",
    ]
    assert "[INFO] batch job_id=9 restart=1" in done.stdout
    assert "srun exited with status 0" in done.stdout

    failed = _run_sbatch(tmp_path, {**env, "FAKE_SRUN_RC": "13"})
    assert failed.returncode == 13 and "srun exited with status 13" in failed.stdout


@pytest.mark.parametrize("missing", ["REBOUND_PYTHON", "REBOUND_RUN_DIR"])
def test_batch_script_fails_clearly_without_its_variables(tmp_path: Path, missing: str) -> None:
    env = {"REBOUND_PYTHON": sys.executable, "REBOUND_RUN_DIR": str(tmp_path / "run")}
    del env[missing]
    done = _run_sbatch(tmp_path, env)
    assert done.returncode == 2
    assert f"{missing} is not set" in done.stderr
    assert not (tmp_path / "srun-args").exists()


def test_batch_script_defaults() -> None:
    directives = [
        line.split(None, 1)[1] for line in submit.SBATCH_SCRIPT.read_text().splitlines() if line.startswith("#SBATCH")
    ]
    for expected in ("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2", "--requeue"):
        assert expected in directives


def test_submit_demo_under_torchrun_runs_one_task_per_node_into_slurm_out(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path / "lab")
    sbatch = _script(tmp_path / "sbatch", FAKE_SBATCH)
    env = {"PATH": os.environ["PATH"], "FAKE_DIR": str(tmp_path)}
    submit.submit_demo(layout, "t1", tasks_per_node=2, env=env, sbatch=str(sbatch), launcher="torchrun")
    args = (tmp_path / "args").read_text().splitlines()
    options = args[: args.index(str(submit.TORCHRUN_SBATCH_SCRIPT))]
    run_dir = layout.run_dir("t1")
    assert "--ntasks-per-node=1" in options and "--gres=gpu:2" in options
    assert not any(o.startswith("--output=") for o in options)  # Slurm's default: slurm-%j.out in the run dir
    assert f"--comment=rebound: ckpt={run_dir}/checkpoints;logs={run_dir}/slurm-%j.out" in options
    job_env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert job_env["REBOUND_NPROC"] == "2"
    with pytest.raises(ValueError, match="launcher"):
        submit.sbatch_command(layout, "t1", launcher="mpirun")


def test_a_budget_travels_in_the_opt_in_comment(tmp_path: Path) -> None:
    layout = LabLayout(tmp_path / "lab")
    sbatch = _script(tmp_path / "sbatch", FAKE_SBATCH)
    env = {"PATH": os.environ["PATH"], "FAKE_DIR": str(tmp_path)}
    submit.submit_demo(layout, "b1", env=env, sbatch=str(sbatch), budget=10)
    comment = next(a for a in (tmp_path / "args").read_text().splitlines() if a.startswith("--comment="))
    assert comment.endswith(";budget=10") and "logs=" in comment
