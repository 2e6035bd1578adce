"""A real Hugging Face Trainer job for the lab: a 2-layer GPT-2 built from config (nothing downloaded), random
tokens, DDP over gloo on CPU (accelerate's MULTI_CPU), ``checkpoint-N/`` saves with safetensors weights, and resume
from its own latest checkpoint on every restart (``get_last_checkpoint``).

Run as ``srun python -m deploy.demo.train_hf --run-dir DIR [--steps N] [--checkpoint-every K]``
(``train_hf.sbatch`` does). Needs the ``trainers`` extra.

Launched one srun task per rank with torch's ``env://`` variables set from srun's (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` from ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``), rather than by torchrun under srun:
every rank is then a Slurm task (a killed rank is a failed task Slurm reports, and its rank file names its pid for
``rebound lab inject``), nothing restarts ranks behind Slurm's back (torchrun's agent would), and gloo's rendezvous
is the demo's loopback address with a port per attempt, where torchrun's c10d rendezvous would need a per-job port
and a node name every lab node resolves to itself.

Output: the Trainer's own (``disable_tqdm`` is left to its default: on, it prints a tqdm bar on stderr of rank 0; the
loss every ``logging_steps``), and on a restart our one line naming the checkpoint it resumes from, as a user's
script that calls ``get_last_checkpoint`` typically prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from deploy.demo.real_trainers import parse_trainer_args, set_up_rank

VOCAB = 128
CONTEXT = 32


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_trainer_args("python -m deploy.demo.train_hf", __doc__.splitlines()[0], argv)
    setup = set_up_rank(args, os.environ)
    os.environ.update(
        RANK=str(setup.env.rank),
        WORLD_SIZE=str(setup.env.world_size),
        LOCAL_RANK=str(setup.env.local_rank),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    class LabHooks(TrainerCallback):
        """The lab's fault injection and simulated device time, at the start of every step."""

        def on_step_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            setup.at_step_start(state.global_step)

    torch.manual_seed(args.seed)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=CONTEXT, bos_token_id=0, eos_token_id=0
    )
    tokens = torch.randint(0, VOCAB, (256, CONTEXT), generator=torch.Generator().manual_seed(args.seed))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    training = TrainingArguments(
        output_dir=str(setup.paths.checkpoints),
        max_steps=args.steps,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        save_total_limit=3,
        per_device_train_batch_size=args.batch_size,
        use_cpu=True,
        ddp_backend="gloo",
        logging_steps=args.checkpoint_every,
        report_to=[],
        dataloader_num_workers=0,
        seed=args.seed,
    )
    last: str | None = get_last_checkpoint(str(setup.paths.checkpoints))  # type: ignore[no-untyped-call]
    if last is not None and setup.env.rank == 0:
        print(f"resuming from checkpoint {last}", flush=True)
    model = GPT2LMHeadModel(config)  # type: ignore[no-untyped-call]
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[LabHooks()])
    trainer.train(resume_from_checkpoint=last)
    # Tear the gloo group down before the interpreter exits: left to exit-time destructors, its threads can abort
    # the finished process ("terminate called without an active exception", exit -6; seen once in a clean-clone run).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
