"""What the lab's real-trainer jobs (``train_lightning.py``, ``train_hf.py``) share with the demo trainer.

Each runs as one srun task per rank, like the demo: identity from srun (``RankEnv``), a rendezvous port per job and
attempt (``deploy.demo.train.rendezvous_address``: a requeued attempt never meets a lingering process of the previous
one), the rank file that ``rebound lab inject`` finds the rank's pid in (rank kill, ``segv``), and the trainer-side
fault hooks (``crash``, ``hang``, ``slow``, ``gpu-fault``, ``user-bug``) applied at the start of every step from
the trainer's own step callback. Nothing here prints per step: these jobs' output is what the frameworks print.

Kept free of Lightning and transformers imports, so each job imports only its own framework.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.demo.common import RankEnv, RunPaths
from deploy.demo.faults import FaultWatcher
from deploy.demo.train import rendezvous_address, synchronize_device, write_rank_info

__all__ = ["RankSetup", "parse_trainer_args", "set_up_rank"]


def parse_trainer_args(prog: str, description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo trainer's options (``deploy.demo.submit`` passes the same ones to every trainer)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's directory (logs/, checkpoints/, ...)")
    parser.add_argument("--steps", type=int, default=2000, help="total optimizer steps of the run")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="save a checkpoint every K steps")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="simulated device seconds per step")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


@dataclass
class RankSetup:
    env: RankEnv
    paths: RunPaths
    watcher: FaultWatcher
    step_sleep: float

    def at_step_start(self, step: int) -> None:
        """The step's simulated device time and the faults due (``crash`` and ``hang`` do not return; ``gpu-fault``
        raises PyTorch's CUDA error, ``user-bug`` the ValueError of a data pipeline that lost a column)."""
        faults = self.watcher.check(step)
        time.sleep(self.step_sleep + faults.extra_delay_s)
        synchronize_device(faults.cuda_error)
        if faults.corrupt_next_batch:
            raise ValueError(f"shape mismatch at step {step}: the batch lost a feature column (injected user bug)")


def set_up_rank(args: argparse.Namespace, environ: MutableMapping[str, str]) -> RankSetup:
    """Identity, rank file and rendezvous for one rank; sets ``MASTER_ADDR``/``MASTER_PORT`` in ``environ`` (what
    Lightning's SLURMEnvironment and torch's ``env://`` read) and the single-thread limit a 2-core lab needs."""
    import torch

    env = RankEnv.from_environ(environ)
    paths = RunPaths(args.run_dir.resolve())
    paths.ensure()
    torch.set_num_threads(1)
    write_rank_info(paths, env)
    addr, port = rendezvous_address(env, environ)
    environ["MASTER_ADDR"] = addr
    environ["MASTER_PORT"] = str(port)
    os.chdir(paths.run_dir)
    return RankSetup(env=env, paths=paths, watcher=FaultWatcher(paths, env), step_sleep=args.step_sleep)
