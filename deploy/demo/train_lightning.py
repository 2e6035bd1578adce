"""A real PyTorch Lightning job for the lab: DDP over gloo on CPU, one srun task per rank (Lightning's
SLURMEnvironment), its own ModelCheckpoint, and resume from ``last.ckpt`` on every restart (``ckpt_path="last"``).

Run as ``srun python -m deploy.demo.train_lightning --run-dir DIR [--steps N] [--checkpoint-every K]``
(``train_lightning.sbatch`` does). Needs the ``trainers`` extra.

Output is Lightning's own, nothing of ours per step: this is the "silent" job of issue 11. Lightning 2.6's default
progress bar is ``RichProgressBar`` when ``rich`` is installed (it is, through transformers), and rich without a
terminal draws no frames while an epoch runs (one line when it ends, and here an epoch is the whole run); without
rich it would be a tqdm bar on stdout with ``\r`` frames on rank 0. What Lightning does print (rank 0, stderr):
``Initializing distributed: GLOBAL_RANK: ...``, and on a restart ``Restoring states from the checkpoint path at
.../last.ckpt`` and ``Restored all states from the checkpoint at .../last.ckpt``.

Checkpoints (``checkpoints/``): ``step=N.ckpt`` every K steps (the 3 newest kept) and ``last.ckpt`` (a copy).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from deploy.demo.real_trainers import RankSetup, parse_trainer_args, set_up_rank

IN_FEATURES = 32
HIDDEN = 64
KEEP = 3


def build(setup: RankSetup, steps: int, checkpoint_every: int, batch_size: int, seed: int) -> tuple[Any, Any, Any]:
    """The module, its data and the Trainer (imports Lightning here: the module stays importable without it)."""
    import lightning
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy

    class Synthetic(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
        """Sample ``i`` is a pure function of (seed, i): a resumed run sees the same data."""

        def __len__(self) -> int:
            return steps * batch_size * setup.env.world_size

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
            x = torch.randn(IN_FEATURES, generator=gen)
            return x, torch.tanh(x[:1] * 2.0)

    class Regressor(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
            )

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class LabHooks(Callback):
        """The lab's fault injection and simulated device time, at the start of every step."""

        def on_train_batch_start(self, trainer: Any, *_: Any) -> None:
            setup.at_step_start(int(trainer.global_step))

    saver = ModelCheckpoint(
        dirpath=setup.paths.checkpoints,
        filename="{step}",
        every_n_train_steps=checkpoint_every,
        monitor="step",
        mode="max",
        save_top_k=KEEP,
        save_last=True,
    )
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("SLURM_NTASKS_PER_NODE", "1")),
        num_nodes=int(os.environ.get("SLURM_NNODES", "1")),
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=steps,
        callbacks=[saver, LabHooks()],
        logger=False,
        enable_model_summary=False,
        default_root_dir=setup.paths.run_dir,
    )
    data = torch.utils.data.DataLoader(Synthetic(), batch_size=batch_size)
    return Regressor(), data, trainer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_trainer_args("python -m deploy.demo.train_lightning", __doc__.splitlines()[0], argv)
    setup = set_up_rank(args, os.environ)
    model, data, trainer = build(setup, args.steps, args.checkpoint_every, args.batch_size, args.seed)
    # "last": Lightning's own resume, from last.ckpt when there is one, from scratch (with a warning) when not.
    trainer.fit(model, train_dataloaders=data, ckpt_path="last")
    return 0


if __name__ == "__main__":
    sys.exit(main())
