"""Lines for the equivalence tests of the hot path's shortcuts (each run beside the code it replaced): every line of
the repository's test logs, and generated lines in the shapes a watch reads (srun ``--label`` and torchrun
``[rankN]:`` prefixes, ``\\r`` progress-bar redraws, tqdm's first frames, timestamps with and without zones, step
lines whose loss is finite, NaN or Inf, non-ASCII text, a partial last line)."""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

__all__ = ["DATA", "corpus_files", "corpus_lines", "generated_lines", "generated_logs"]

DATA = Path(__file__).resolve().parents[2] / "data"
_EOL = re.compile(r"\r\n|\r|\n")


def corpus_files() -> list[Path]:
    """Every ``.log`` file under ``tests/data``."""
    return sorted(DATA.rglob("*.log"))


@functools.cache
def corpus_lines() -> tuple[str, ...]:
    """Every line of every test log (split as the tail splits: ``\\n``, ``\\r\\n``, a bare ``\\r``)."""
    return tuple(line for p in corpus_files() for line in _EOL.split(p.read_text(errors="replace")) if line)


_STAMPS = (
    "2026-12-02T07:50:01.123Z ",
    "[2026-11-30 03:40:01,123] ",
    "2026-12-02 07:50:01 ",
    "2026-12-02T07:50:01+05:30 ",
)
_PREFIXES = ("", "3: ", " 12: ", "[rank5]: ", "[default2]: ", "0: [rank7]: ", "\x1b[32m", "host-01: ")
_BODIES = (
    "[INFO] rank={r}/8 node=g00001 step={s} loss={loss} step_time=1.000s compute_time=0.800s",
    "step={s} loss={loss} step_time={ms}ms",
    "iter {s}: loss {loss}, time 123.45ms, mfu 30.12%",
    " iteration      {s}/    1000 | elapsed time per iteration (ms): 1234.5 | lm loss: {loss} |",
    "Epoch 0:  10%|█         | {s}/1200 [00:10<01:30, 12.00it/s, v_num=0, train_loss={loss}]",
    " 10%|#         | {s}/1200 [00:10<01:30,  2.54s/it]",
    "  0%|          | 0/1200 [00:00<?, ?it/s]",
    " 15%|#5        | {s}/1200 [00:00<?, ?it/s]",
    "steps: {s} loss: {loss} iter time (s): 0.123 samples/sec: 260.1",
    "Training epoch 0, iteration 3/10 | lr: 1e-05 | global_step: {s} | reduced_train_loss: {loss} |",
    "{{'loss': {loss}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}}",
    "global_step={s} time_per_step=1.5e-1 train loss: {loss}",
    "Step {s}/1000 | Loss is {loss} | grad_norm: nan",
    "Saving checkpoint at step {s}",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "NCCL INFO Channel 00/02 : 0[0] -> 1[1] via P2P/IPC loss {loss}",
    "Traceback (most recent call last):",
    '  File "/opt/train/train.py", line 342, in <module>',
    "    loss.backward()",
    "torch.distributed.DistBackendError: NCCL error: unhandled system error",
    "Loading checkpoint from /ckpt/step_{s}",
    "ſtep {s} İTERATION 8 \u212aeep lo\u017fs=nan",
    "train_step_timing in s: 0.031 | global_step: {s}",
    "loss_cls: {loss}, INFO step {s}",
    "Minimum loss scale reached",
)
_LOSSES = ("0.4123", "1.6129", "nan", "NaN", "inf", "-inf", "Infinity", "tensor(nan, device='cuda:0')", "1e-3")


def generated_lines(n: int = 4000, seed: int = 12) -> list[str]:
    """``n`` lines: a prefix, maybe a timestamp, a body of some trainer's shape (loss finite or not)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = rng.choice(_BODIES).format(
            r=rng.randrange(8),
            s=rng.randrange(0, 10 ** rng.randrange(1, 7)),
            loss=rng.choice(_LOSSES),
            ms=rng.randrange(2000),
        )
        stamp = rng.choice(_STAMPS) if rng.random() < 0.7 else ""
        prefix = rng.choice(_PREFIXES)
        out.append(prefix + stamp + body if i % 3 else stamp + prefix + body)
    return out


def generated_logs(files: int = 40, seed: int = 7) -> list[bytes]:
    """Whole files' bytes: generated lines joined by ``\\n``, ``\\r\\n`` or ``\\r`` (bar redraws), some ending in a
    partial line, some with an invalid UTF-8 byte."""
    rng = random.Random(seed)
    lines = generated_lines(files * 60, seed)
    out = []
    for f in range(files):
        parts = []
        for line in lines[f * 60 : (f + 1) * 60]:
            parts.append(line.encode() + rng.choice((b"\n", b"\n", b"\r\n", b"\r")))
        if f % 4 == 1:
            parts.append(b"2026-12-02T07:50:01.123Z step=9 loss=0.1 (partial, no end")
        if f % 5 == 2:
            parts.insert(3, b"bad \xff\xfe byte step=4 loss=nan\n")
        out.append(b"".join(parts))
    return out
