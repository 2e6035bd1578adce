"""The demo trainer: its identity and rendezvous rules, and real 2-rank training with checkpoint and resume."""

from __future__ import annotations

import json
import re

import pytest

from deploy.demo import train
from deploy.demo.common import RankEnv, RankInfo, gpu_index_for, log_line, utc_iso
from deploy.demo.ports import PORT_SLOT_ENV, rendezvous_port
from deploy.local.layout import LabLayout
from tests.demo.conftest import STEP_LINE, Launcher

SLURM_ENV = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n2"}


def test_rank_env_from_slurm_variables() -> None:
    env = RankEnv.from_environ({**SLURM_ENV, "SLURM_JOB_ID": "19", "SLURM_RESTART_COUNT": "2", "HOSTNAME": "box"})
    assert env == RankEnv(rank=3, world_size=4, local_rank=1, node="n2", restart=2, job_id=19, gpu=1)
    bare = RankEnv.from_environ(SLURM_ENV)
    assert (bare.restart, bare.job_id) == (0, None)


def test_rank_env_under_torchrun_takes_the_workers_rank() -> None:
    # torchrun under srun --ntasks-per-node=1: the worker inherits its node's task (SLURM_PROCID=1, SLURM_NTASKS=2)
    torchrun = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    env = RankEnv.from_environ({**torchrun, "SLURMD_NODENAME": "n2", "SLURM_JOB_GPUS": "0,1"})
    assert (env.rank, env.world_size, env.local_rank, env.node, env.gpu) == (2, 4, 0, "n2", 0)


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_NTASKS", "SLURMD_NODENAME"])
def test_rank_env_requires_slurm_variables(missing: str) -> None:
    env = {k: v for k, v in SLURM_ENV.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        RankEnv.from_environ(env)


def test_gpu_index_prefers_physical_indexes() -> None:
    assert gpu_index_for(1, {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == 3
    assert gpu_index_for(1, {"SLURM_JOB_GPUS": "0,1"}) == 1
    assert gpu_index_for(3, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 1
    assert gpu_index_for(2, {"CUDA_VISIBLE_DEVICES": "GPU-1234"}) == 2
    assert gpu_index_for(1, {}) == 1


def test_the_rendezvous_address_is_the_attempts_port_unless_the_job_names_one() -> None:
    env = RankEnv.from_environ({**SLURM_ENV, "SLURM_JOB_ID": "19"})
    assert train.rendezvous_address(env, {}) == ("127.0.0.1", rendezvous_port(19, 0))
    assert train.rendezvous_address(env, {PORT_SLOT_ENV: "1"}) == ("127.0.0.1", rendezvous_port(19, 0, 1))
    assert train.rendezvous_address(env, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}) == ("10.0.0.1", 1234)


def test_log_line_format() -> None:
    message = "step=120 loss=0.4123 step_time=0.105s compute_time=0.081s"
    line = log_line("INFO", 1, 4, "n1", message, now=1_795_923_601.1234)
    assert line == f"2026-11-29T03:40:01.123Z [INFO] rank=1/4 node=n1 {message}"
    assert STEP_LINE.match(line)
    assert utc_iso(0.9999) == "1970-01-01T00:00:00.999Z"


def test_user_bug_trips_the_shape_check() -> None:
    teacher = train.teacher_weights(1)
    x, y = train.make_batch(1, 5, 0, 8, teacher)
    train.check_batch(x, y)
    bad_x, bad_y = train.make_batch(1, 5, 0, 8, teacher, drop_feature=True)
    with pytest.raises(ValueError, match=r"shape mismatch: expected inputs of shape \[batch, 32\]"):
        train.check_batch(bad_x, bad_y)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        train.parse_args(["--run-dir", "/tmp/x", "--checkpoint-every", "0"])


@pytest.mark.timeout(90)
def test_trains_checkpoints_and_resumes(launch: Launcher, layout: LabLayout) -> None:
    first = launch(steps=12, checkpoint_every=5, step_sleep=0.02)
    assert first.wait(60) == [0, 0]
    run_dir = layout.run_dir("demo")
    for rank in (0, 1):
        log = first.log(rank)
        assert f"rank={rank}/2 node=n{rank + 1} starting: job_id=7 restart=0 world_size=2" in log
        assert "no checkpoint found, starting from step 0" in log
        assert [s for s, _, _ in first.steps(rank)] == list(range(1, 13))
        assert re.search(r"training complete: steps=12 steps_this_attempt=12 final_loss=\d", log)
        info = RankInfo.model_validate_json((run_dir / "ranks" / f"rank-{rank}.json").read_bytes())
        assert (info.rank, info.node, info.restart, info.job_id, info.local_rank) == (rank, f"n{rank + 1}", 0, 7, 0)
        assert info.pid == first.procs[rank].pid
    # Data parallel: every rank logs the same (all-reduced) loss.
    assert [loss for _, loss, _ in first.steps(0)] == [loss for _, loss, _ in first.steps(1)]
    assert "saved checkpoint step_000010 (step 10," in first.log(0)
    assert "saved checkpoint" not in first.log(1)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000005", "step_000010"]
    meta = json.loads((run_dir / "checkpoints" / "step_000010" / "meta.json").read_text())
    assert (meta["job_id"], meta["restart"], meta["world_size"]) == (7, 0, 2)

    # The requeued attempt resumes from step 10 and redoes steps 11 and 12 exactly (same data, same state).
    second = launch(steps=16, checkpoint_every=5, step_sleep=0.02, restart=1)
    assert second.wait(60) == [0, 0]
    for rank in (0, 1):
        log = second.log(rank)
        assert "starting: job_id=7 restart=1" in log
        assert "resumed from checkpoint step_000010 (step 10)" in log
        assert [s for s, _, _ in second.steps(rank)] == list(range(11, 17))
    redone = {s: loss for s, loss, _ in second.steps(0) if s <= 12}
    assert redone == {s: loss for s, loss, _ in first.steps(0) if s > 10}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000005", "step_000010", "step_000015"]


@pytest.mark.timeout(60)
def test_resume_skips_a_corrupt_checkpoint(launch: Launcher, layout: LabLayout) -> None:
    first = launch(steps=10, checkpoint_every=5, step_sleep=0.0)
    assert first.wait(60) == [0, 0]
    ckpts = layout.run_dir("demo") / "checkpoints"
    (ckpts / "step_000010" / "state.pt").write_bytes(b"torn write")

    second = launch(steps=6, checkpoint_every=5, step_sleep=0.0, restart=1)
    assert second.wait(60) == [0, 0]
    for rank in (0, 1):
        log = second.log(rank)
        assert "[WARNING] rank=" in log and "skipping checkpoint step_000010: corrupt: sha256 mismatch" in log
        assert "resumed from checkpoint step_000005 (step 5)" in log
        assert [s for s, _, _ in second.steps(rank)] == [6]
