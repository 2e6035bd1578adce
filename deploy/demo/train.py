"""The demo training job: real data-parallel torch.distributed (gloo, CPU) training, one process per srun task.

Run as ``python -m deploy.demo.train --run-dir DIR [--steps N] [--checkpoint-every K] [--step-sleep S]``.

Identity comes from srun: rank ``SLURM_PROCID``, world ``SLURM_NTASKS``, local rank ``SLURM_LOCALID``, node
``SLURMD_NODENAME`` (never ``hostname``: every lab node is the same host), attempt ``SLURM_RESTART_COUNT``.
Rendezvous is ``tcp://127.0.0.1:<port>`` with the port derived from the job id *and* the restart count, so a
requeued attempt never meets a lingering process of the previous one; ``MASTER_ADDR``/``MASTER_PORT`` override.

Every rank prints, flushed, one line per step (``deploy.demo.common.log_line``)::

    2026-11-30T03:40:01.123Z [INFO] rank=1/4 node=n1 step=120 loss=0.4123 step_time=0.105s compute_time=0.081s

``step_time`` is the whole step, the same on every rank (the all_reduce waits for the slowest); ``compute_time``
is this rank's own work before the collective, the per-rank figure a straggler shows in (as Megatron's timers and
NVRx's section timing do).

Each step: check ``control/`` for faults, build a synthetic batch seeded by (seed, step, rank), forward and
backward, sleep ``--step-sleep`` (the "device time" a 2-core lab cannot spend on real compute), one all_reduce of
all gradients plus the loss, optimizer step; rank 0 saves a checkpoint every K steps.
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from deploy.demo.checkpoint import (
    DEFAULT_KEEP,
    find_latest_valid,
    prune_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from deploy.demo.common import RankEnv, RankInfo, RunPaths, atomic_write_json, log_line, utc_iso
from deploy.demo.faults import FaultWatcher
from deploy.demo.ports import port_slot, rendezvous_port
from deploy.demo.procs import proc_start_ticks

IN_FEATURES = 32
HIDDEN = 64
DEFAULT_GLOO_TIMEOUT_S = 1800.0


def rendezvous_address(env: RankEnv, environ: Mapping[str, str]) -> tuple[str, int]:
    """``(addr, port)``: ``MASTER_ADDR``/``MASTER_PORT`` when set, else loopback and the derived port."""
    addr = environ.get("MASTER_ADDR") or "127.0.0.1"
    port_text = environ.get("MASTER_PORT")
    port = int(port_text) if port_text else rendezvous_port(env.job_id, env.restart, port_slot(environ))
    return addr, port


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.demo.train", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's directory (logs/, checkpoints/, ...)")
    parser.add_argument("--steps", type=int, default=2000, help="total optimizer steps of the run")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="rank 0 saves every K steps")
    parser.add_argument("--keep-checkpoints", type=int, default=DEFAULT_KEEP, help="valid checkpoints kept")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="simulated device seconds per step")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate (SGD with momentum 0.9)")
    parser.add_argument("--seed", type=int, default=1234, help="seeds the model, the teacher and the data")
    parser.add_argument(
        "--gloo-timeout",
        type=float,
        default=DEFAULT_GLOO_TIMEOUT_S,
        help="seconds a collective may wait for its peers (long, so that a hang really hangs)",
    )
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.keep_checkpoints < 1 or args.step_sleep < 0:
        parser.error("--steps must be >= 0, --checkpoint-every and --keep-checkpoints >= 1, --step-sleep >= 0")
    return args


class RankLogger:
    """Prints this rank's log lines to stdout, flushed, so a killed rank's last line is on disk."""

    def __init__(self, env: RankEnv) -> None:
        self._env = env

    def emit(self, level: str, message: str) -> None:
        print(log_line(level, self._env.rank, self._env.world_size, self._env.node, message), flush=True)

    def info(self, message: str) -> None:
        self.emit("INFO", message)

    def warning(self, message: str) -> None:
        self.emit("WARNING", message)


class MomentumSGD:
    """SGD with momentum, written out: any ``torch.optim`` optimizer imports ``torch._dynamo`` (about 1.2 s of
    CPU per rank), which on a 2-core lab running 4 ranks would add seconds to every (re)start."""

    def __init__(self, params: Sequence[nn.Parameter], lr: float, momentum: float = 0.9) -> None:
        self.params = list(params)
        self.lr = lr
        self.momentum = momentum
        self.buffers = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, buf in zip(self.params, self.buffers, strict=True):
            if p.grad is not None:
                buf.mul_(self.momentum).add_(p.grad)
                p.add_(buf, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "buffers": [b.clone() for b in self.buffers]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        buffers = state["buffers"]
        if len(buffers) != len(self.buffers):
            raise ValueError(f"optimizer state has {len(buffers)} buffers, the model needs {len(self.buffers)}")
        for buf, saved in zip(self.buffers, buffers, strict=True):
            buf.copy_(saved)


def build_model(seed: int) -> nn.Module:
    """A 2-layer MLP, initialised identically on every rank (same seed), so no parameter broadcast is needed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def teacher_weights(seed: int) -> torch.Tensor:
    """The fixed function the model learns, so the loss really goes down."""
    return torch.randn(IN_FEATURES, 1, generator=torch.Generator().manual_seed(seed + 1)) / math.sqrt(IN_FEATURES)


def make_batch(
    seed: int, step: int, rank: int, batch_size: int, teacher: torch.Tensor, *, drop_feature: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of the step's data, a pure function of (seed, step, rank): a redone step sees the
    same data, so a resumed run repeats the lost steps exactly.

    ``drop_feature`` is the injected user bug: a data pipeline that loses a column.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(batch_size, IN_FEATURES, generator=gen)
    y = torch.tanh(2.0 * (x @ teacher))
    if drop_feature:
        x = x[:, 1:]
    return x, y


def check_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    """The kind of shape check real training code has; the user-bug fault trips it."""
    if x.dim() != 2 or x.shape[1] != IN_FEATURES or y.shape[0] != x.shape[0]:
        raise ValueError(
            f"shape mismatch: expected inputs of shape [batch, {IN_FEATURES}] and matching targets, "
            f"got inputs {list(x.shape)} and targets {list(y.shape)}"
        )


def synchronize_device(pending_error: str | None) -> None:
    """Where a real GPU run would learn of an asynchronous CUDA error: the next synchronising call."""
    if pending_error is not None:
        raise RuntimeError(pending_error)


def allreduce_gradients(model: nn.Module, loss: torch.Tensor, world_size: int) -> float:
    """Average all gradients and the loss across ranks with a single all_reduce; returns the mean loss."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n
    return float(flat[-1])


def state_bytes(model: nn.Module, optimizer: MomentumSGD, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
    return buf.getvalue()


def load_state(model: nn.Module, optimizer: MomentumSGD, payload: bytes) -> int:
    state = torch.load(io.BytesIO(payload), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def resume(paths: RunPaths, model: nn.Module, optimizer: MomentumSGD, log: RankLogger) -> int:
    """Load the latest valid checkpoint; returns the step it holds (0 without one).

    Every rank scans (and logs what it skips), then all take rank 0's choice: ranks must start from the same
    state even if a lingering writer changed the directory between their scans.
    """
    scan = find_latest_valid(paths.checkpoints)
    for name, reason in scan.skipped:
        log.warning(f"skipping checkpoint {name}: {reason}")
    choice = torch.tensor([scan.latest.step if scan.latest else -1], dtype=torch.int64)
    dist.broadcast(choice, src=0)
    step = int(choice.item())
    if step < 0:
        log.info("no checkpoint found, starting from step 0")
        return 0
    info, payload = read_checkpoint(paths.checkpoints, step)
    loaded = load_state(model, optimizer, payload)
    if loaded != step:
        raise RuntimeError(f"checkpoint {info.name} holds step {loaded}, expected {step}")
    log.info(f"resumed from checkpoint {info.name} (step {step})")
    return step


def save_checkpoint(
    paths: RunPaths,
    env: RankEnv,
    model: nn.Module,
    optimizer: MomentumSGD,
    step: int,
    keep: int,
    log: RankLogger,
) -> None:
    started = time.monotonic()
    payload = state_bytes(model, optimizer, step)
    meta = {
        "job_id": env.job_id,
        "restart": env.restart,
        "world_size": env.world_size,
        "saved_at": utc_iso(time.time()),
    }
    info = write_checkpoint(paths.checkpoints, step, payload, meta)
    prune_checkpoints(paths.checkpoints, keep)
    log.info(f"saved checkpoint {info.name} (step {step}, {info.size} bytes, {time.monotonic() - started:.3f}s)")


def write_rank_info(paths: RunPaths, env: RankEnv) -> None:
    pid = os.getpid()
    info = RankInfo(
        pid=pid,
        rank=env.rank,
        world_size=env.world_size,
        node=env.node,
        local_rank=env.local_rank,
        restart=env.restart,
        job_id=env.job_id,
        gpu=env.gpu,
        proc_start=proc_start_ticks(pid),
        started_at=utc_iso(time.time()),
    )
    atomic_write_json(paths.rank_file(env.rank), info)


def write_progress(paths: RunPaths, env: RankEnv, step: int) -> None:
    """Heartbeat file: the step this rank is starting (tmp + rename, about 0.1 ms)."""
    target = paths.progress_file(env.rank)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(f"{step} {time.time():.3f}\n")
    os.replace(tmp, target)


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Train to ``args.steps``; returns the exit status. Raises whatever a fault or a dead peer raises."""
    env = RankEnv.from_environ(environ)
    paths = RunPaths(args.run_dir.resolve())
    paths.ensure()
    log = RankLogger(env)
    # 4 ranks share 2 cores: intra-op threads would only fight each other.
    torch.set_num_threads(1)
    write_rank_info(paths, env)
    addr, port = rendezvous_address(env, environ)
    log.info(
        f"starting: job_id={env.job_id} restart={env.restart} world_size={env.world_size} "
        f"local_rank={env.local_rank} gpu={env.gpu} pid={os.getpid()} rendezvous={addr}:{port} "
        f"steps={args.steps} checkpoint_every={args.checkpoint_every}"
    )
    if addr.startswith("127.") or addr == "localhost":
        # gloo otherwise binds to the address `hostname` resolves to, which may be absent or unroutable.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    started = time.monotonic()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=args.gloo_timeout),
    )
    log.info(
        f"process group ready: backend=gloo world_size={env.world_size} init_time={time.monotonic() - started:.2f}s"
    )

    model = build_model(args.seed)
    optimizer = MomentumSGD(list(model.parameters()), lr=args.lr)
    teacher = teacher_weights(args.seed)
    start_step = resume(paths, model, optimizer, log)
    watcher = FaultWatcher(paths, env, emit=lambda line: print(line, flush=True))

    loss_value = float("nan")
    train_started = time.monotonic()
    for step in range(start_step + 1, args.steps + 1):
        step_started = time.monotonic()
        faults = watcher.check(step)
        write_progress(paths, env, step)
        x, y = make_batch(args.seed, step, env.rank, args.batch_size, teacher, drop_feature=faults.corrupt_next_batch)
        check_batch(x, y)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        # Simulated device time; a straggler's extra delay lands here, before the collective, so its peers
        # spend the difference waiting inside all_reduce, as with a real slow GPU.
        time.sleep(args.step_sleep + faults.extra_delay_s)
        synchronize_device(faults.cuda_error)
        compute_time = time.monotonic() - step_started
        loss_value = allreduce_gradients(model, loss, env.world_size)
        optimizer.step()
        step_time = time.monotonic() - step_started
        log.info(f"step={step} loss={loss_value:.4f} step_time={step_time:.3f}s compute_time={compute_time:.3f}s")
        if env.rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(paths, env, model, optimizer, step, args.keep_checkpoints, log)

    done = max(0, args.steps - start_step)
    log.info(
        f"training complete: steps={args.steps} steps_this_attempt={done} final_loss={loss_value:.4f} "
        f"elapsed={time.monotonic() - train_started:.1f}s"
    )
    dist.destroy_process_group()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Fatal signals print the Python stack like a real trainer's crash; SIGUSR2 dumps every thread's stack
    # on demand (a hung rank's "where are you") without stopping it.
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:
        return run(args, os.environ)
    except Exception:
        # Print exactly what an uncaught exception prints, then leave without running interpreter teardown:
        # with a dead peer, tearing down the gloo process group can block.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
