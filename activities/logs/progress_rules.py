"""The progress tables: which log lines report a training step, a step's duration or a checkpoint load.

Read by ``activities.logs.progress`` (which documents how the tables are applied). Each wording comes from a public
log of the trainer it names; the tests (``tests/unit/logs/test_progress.py``, ``test_trainer_formats.py``) hold one
real line per rule.

How each trainer counts (``StepRule.zero_based``): most print the number of optimizer steps done (HF Trainer's
``global_step``, Megatron-LM's ``iteration``, DeepSpeed's ``step=``/``steps:``, torchtitan's ``step:``, a bar's
``n``, our demo's ``step=``): the first step trained prints 1, and after a resume from a checkpoint holding N steps
the first step trained prints N + 1. nanoGPT's ``iter N`` and NeMo's ``global_step: N`` print the index of the
step just trained, from 0: N + 1 steps are done (``StepMark.steps_done``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BAR_NOT_STARTED",
    "CHECKPOINT_RULES",
    "CHECKPOINT_STEP",
    "CHECKPOINT_WORDS",
    "EPOCH",
    "NOT_PROGRESS",
    "NOT_PROGRESS_WORDS",
    "STEP_RULES",
    "STEP_TIME_RULES",
    "TRAINING_LOG",
    "CheckpointRule",
    "StepRule",
    "StepTimeRule",
]


@dataclass(frozen=True, slots=True)
class StepRule:
    name: str
    pattern: re.Pattern[str]
    bar: bool = False
    """A tqdm/Lightning progress bar frame: its count at 0, or before the bar counted anything, is no step."""
    zero_based: bool = False
    """The line prints the index of the step just trained, from 0 (module docstring)."""
    per_epoch: bool = False
    """The count starts again every epoch (Lightning's bar counts batches of the epoch): not a global step."""
    needs: str = ""
    """Text (lower case) that every line the pattern matches contains: an ASCII line without it skips the regex
    (``activities.logs.progress``); "" for none."""
    starts: bool = False
    """Every match starts where ``needs`` occurs (only zero-width tests before it): an ASCII line is searched from
    its first occurrence, the same leftmost match for less scanning (``tests/unit/logs/test_step_line.py``)."""


@dataclass(frozen=True, slots=True)
class CheckpointRule:
    name: str
    pattern: re.Pattern[str]
    found: bool
    """False for lines saying there was no checkpoint to load."""
    detail: bool = False
    """The line completes or details the file's pending load line (HF's "Continuing training from global step N",
    torchtitan's "Finished loading the checkpoint"): it fills in that line's step instead of naming a load. Without
    a pending load it stands for itself (found or not, as ``found`` says)."""


@dataclass(frozen=True, slots=True)
class StepTimeRule:
    name: str
    pattern: re.Pattern[str]
    """A ``value`` group and an optional ``unit`` group (``s``, ``ms``, ``s/it``, ``it/s``)."""
    field: Literal["step_time_s", "compute_time_s"]
    unit: str = "s"
    """The unit when the line names none."""
    step_rules: frozenset[str] = frozenset()
    """The ``STEP_RULES`` whose lines this rule reads; empty for any."""
    needs: tuple[str, ...] = ()
    """Texts one of which (as written: these patterns are case-sensitive) every line the pattern matches contains:
    a line with none of them skips the regex; empty for none."""
    starts: bool = False
    """Every match starts where one of ``needs`` occurs (only zero-width tests before it): the search starts at the
    first occurrence of any, the same leftmost match for less scanning (``tests/unit/logs/test_step_line.py``)."""


def _s(
    name: str,
    regex: str,
    *,
    needs: str,
    bar: bool = False,
    zero_based: bool = False,
    per_epoch: bool = False,
    starts: bool = False,
) -> StepRule:
    return StepRule(name, re.compile(regex, re.IGNORECASE), bar, zero_based, per_epoch, needs, starts)


def _c(name: str, regex: str, *, found: bool = True, detail: bool = False) -> CheckpointRule:
    return CheckpointRule(name, re.compile(regex, re.IGNORECASE), found, detail)


# ``\s*(?:[:=]\s*)?``, never ``\s*[:=]?\s*``: two adjacent ``\s*`` backtrack quadratically over a run of
# blanks (16k blanks took 1.8 s, measured; a 1 MiB line would take hours).
STEP_RULES: tuple[StepRule, ...] = (
    # NeMo 2 (its Megatron strategy's progress printer): "Training epoch 0, iteration 120/149 | lr: 3e-05 |
    # consumed_samples: 121 | global_batch_size: 1 | global_step: 120 | reduced_train_loss: 1.233 | ..."; the
    # iteration counts within the epoch, global_step across epochs (from 0: "iteration 0/9 | ... global_step: 0").
    _s(
        "nemo",
        r"\bTraining epoch (?P<epoch>\d+), iteration \d+/(?P<total>\d+) \|[^\n]*?\| global_step: (?P<step>\d+) \|",
        needs="training epoch ",
        starts=True,
        zero_based=True,
    ),
    # Megatron-LM: " iteration      120/    1000 | consumed samples: ..."
    _s("megatron", r"\biteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|", needs="iteration", starts=True),
    # Lightning's bar: "Epoch 0:  10%|█         | 120/1200 [00:10<01:30, 12.00it/s, v_num=0, train_loss=0.512]"
    # (NeMo 1's too, with "reduced_train_loss=..., global_step=119.0" in its postfix).
    _s(
        "lightning_bar",
        r"\bEpoch (?P<epoch>\d+):\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)",
        needs="%|",
        bar=True,
        per_epoch=True,
    ),
    # A bare tqdm bar (HF Trainer's counts optimizer steps): " 10%|█         | 120/1200 [00:10<01:30, ...]"
    _s("tqdm_bar", r"^\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\[", needs="%|", bar=True),
    # nanoGPT: "iter 120: loss 2.3100, time 123.45ms, mfu 30.12%", logged after iteration 120 (from 0) trained.
    _s(
        "nanogpt",
        r"(?<![\w.])iter (?P<step>\d+): loss [-+\d.naif]+, time ",
        needs="iter ",
        starts=True,
        zero_based=True,
    ),
    # DeepSpeed's pipeline engine: "steps: 10 loss: 0.6931 iter time (s): 0.123 samples/sec: 260.1"
    _s("deepspeed_steps", r"(?<![\w.])steps: (?P<step>\d+) loss: ", needs="steps: ", starts=True),
    _s("global_step", r"(?<![\w.])global[_ ]step\s*(?:[:=]\s*)?(?P<step>\d+)", needs="global", starts=True),
    _s(
        "iteration",
        r"(?<![\w.])(?:iteration|iter)\s*(?:[:=]\s*)?(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?",
        needs="iter",
        starts=True,
    ),
    # "step=120", "step 120", "Step 120/1000", "step: 120" (torchtitan: "step:  10  loss:  8.1234  memory: ...");
    # not "steps=" or "step_time=".
    _s("step", r"(?<![\w.])step\s*(?:[:=]\s*)?(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?", needs="step", starts=True),
)

#: A bar frame drawn before the bar counted anything since it started: tqdm shows no rate and no time left
#: (``[00:00<?, ?it/s]``) until its count moves past where the bar began.
BAR_NOT_STARTED = re.compile(r"\[[^\]\[<]*<\?[,\]]")

# Atomic: "0.215sec" must not match as "0" followed by something else.
_NUM = r"(?P<value>(?>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))"
STEP_TIME_RULES: tuple[StepTimeRule, ...] = (
    # Ours (deploy/demo/train.py) and key=value loggers: "step_time=0.215s", "'step_time': 0.215", "step_time=215ms".
    StepTimeRule(
        "step_time",
        re.compile(r"(?<![\w.])(?:step_time|time_per_step)['\"]?\s*[:=]\s*" + _NUM + r"\s*(?P<unit>ms|s)?(?![\w/])"),
        "step_time_s",
        needs=("step_time", "time_per_step"),
        starts=True,
    ),
    StepTimeRule(
        "compute_time",
        re.compile(r"(?<![\w.])compute_time['\"]?\s*[:=]\s*" + _NUM + r"\s*(?P<unit>ms|s)?(?![\w/])"),
        "compute_time_s",
        needs=("compute_time",),
        starts=True,
    ),
    # Megatron-LM: "elapsed time per iteration (ms): 1234.5 |", newer ones "... (ms): 1234.5/1200.3 |" (now/mean).
    StepTimeRule(
        "megatron",
        re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM),
        "step_time_s",
        "ms",
        needs=("elapsed time per iteration (ms):",),
        starts=True,
    ),
    # NeMo 2: "| train_step_timing in s: 0.03146 |".
    StepTimeRule(
        "nemo",
        re.compile(r"\btrain_step_timing in s: " + _NUM),
        "step_time_s",
        step_rules=frozenset({"nemo"}),
        needs=("train_step_timing in s: ",),
        starts=True,
    ),
    # DeepSpeed's pipeline engine: "steps: 10 loss: 0.6931 iter time (s): 0.123 samples/sec: 260.1".
    StepTimeRule(
        "deepspeed_iter_time",
        re.compile(r"\biter time \(s\): " + _NUM),
        "step_time_s",
        step_rules=frozenset({"deepspeed_steps"}),
        needs=("iter time (s): ",),
        starts=True,
    ),
    # nanoGPT: "iter 120: loss 2.3100, time 123.45ms, mfu 30.12%".
    StepTimeRule(
        "iter_time",
        re.compile(r"(?<![\w.])time\s*(?:[:=]\s*)?" + _NUM + r"\s*(?P<unit>ms|s)(?![\w/])"),
        "step_time_s",
        step_rules=frozenset({"iteration", "nanogpt"}),
        needs=("time",),
        starts=True,
    ),
    # tqdm's rate inside the bar's brackets: "[00:18<31:07,  2.54s/it, loss=...]" or "[00:10<01:30, 12.00it/s]".
    # No "[" or a second "<" inside: from every "[" the match attempt then ends at the next one (linear, not quadratic).
    StepTimeRule(
        "bar_rate",
        re.compile(r"\[[^\]\[<]*<[^\]\[,]*,\s*" + _NUM + r"(?P<unit>s/it|it/s)"),
        "step_time_s",
        step_rules=frozenset({"lightning_bar", "tqdm_bar"}),
        needs=("<",),
    ),
)

NOT_PROGRESS: tuple[re.Pattern[str], ...] = (
    re.compile(r"checkpoint", re.IGNORECASE),
    # DeepSpeed's timers: "time (ms) | fwd: 5722.49 | bwd: 16107.19 | step: 582.04" (a duration, not a step).
    re.compile(r"\btime \(ms\) \|", re.IGNORECASE),
    re.compile(r"\b(?:error|fatal|exception|traceback)\b", re.IGNORECASE),
    # Plans: "Resuming at step 500", HF's "Continuing training from global step 180", "Will skip the first ...".
    re.compile(
        r"\b(?:starting|start|resuming|restarting|continuing training) (?:from|at) (?:global )?(?:step|iteration)"
        r"|\bskipping\b|\bwill skip\b",
        re.I,
    ),
    # nanoGPT's evaluation at the top of an iteration: "step 2000: train loss 1.6, val loss 1.8" (nothing trained
    # yet in this iteration; after a resume it is printed at the checkpoint's own step).
    re.compile(r"^step \d+: train loss \S+, val loss ", re.IGNORECASE),
)
#: Every line a ``NOT_PROGRESS`` pattern matches holds one of these (lower-cased): an ASCII line with none of them
#: skips the patterns (``activities.logs.progress``; ``tests/unit/logs/test_progress_prefilter.py`` compares).
NOT_PROGRESS_WORDS = (
    "checkpoint",
    "time (ms) |",
    "error",
    "fatal",
    "exception",
    "traceback",
    "start",  # starting, start, restarting
    "resuming",
    "continuing training",
    "skip",  # skipping, will skip
    "val loss",
)

_NAME = r"['\"]?(?P<name>[^\s'\",;]+)['\"]?"
CHECKPOINT_RULES: tuple[CheckpointRule, ...] = (
    _c(
        "none_found",
        r"\bno (?:valid )?checkpoints? (?:was |were )?found|will not load any checkpoints"
        r"|could not find the metadata file|\bfrom scratch\b",
        found=False,
    ),
    # The demo: "resumed from checkpoint step_000010 (step 10)"; also "Resuming from checkpoint /ckpt/x".
    _c("resumed_from", r"\bresum(?:ed|ing) (?:training )?from (?:the )?checkpoint(?::|\s+at)?(?:\s+" + _NAME + ")?"),
    # nanoGPT: "Resuming training from out" (its out_dir; ckpt.pt inside).
    _c("nanogpt_resume", r"^Resuming training from\s+" + _NAME),
    # Megatron: "successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 1000";
    # DeepSpeed: "[Torch] Loaded checkpoint from /ckpt/global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt."
    _c("loaded", r"\b(?:successfully )?loaded (?:the )?checkpoint(?: from)?(?:\s+" + _NAME + ")?"),
    # Lightning: "Restoring states from the checkpoint path at /ckpt/epoch=0-step=100.ckpt" (1.6+; 1.4-1.5 said
    # "checkpoint file at"), then "Restored all states from the checkpoint at ..." ("checkpoint file at" before 2.0).
    _c("lightning_restore", r"\bRestor(?:ing|ed) (?:all )?states from the checkpoint (?:path |file )?at\s+" + _NAME),
    # Lightning's model summary, printed once per fit by its ModelSummary callback (on by default), on rank 0 only:
    # "  | Name  | Type   | Params | Mode", or RichModelSummary's "┃   ┃ Name ┃ Type ┃ Params ┃ Mode ┃". The trainer
    # logs its restore line (above) before the first step in either order: before the summary by default, after
    # it for strategies that restore once set up (DeepSpeed, FSDP). A summary with no restore line before the
    # first step is therefore a start from scratch; after a restore line it only confirms it (like HF's banner).
    _c(
        "lightning_summary",
        r"^\s*[|\u2503](?:\s+[|\u2503])?\s+Name\s+[|\u2503]\s+Type\s+[|\u2503]\s+Params\b",
        found=False,
        detail=True,
    ),
    # HF Trainer: "Loading model from out/checkpoint-180." (its resume; only a checkpoint-N directory, since
    # other tools print the same words for pretrained weights).
    _c("hf_loading_model", r"\bLoading model from\s+['\"]?(?P<name>[^\s'\",;]*checkpoint-\d+[^\s'\",;]*)"),
    # HF Trainer's banner "***** Running training *****", printed after it loaded the checkpoint it resumes from
    # ("Loading model from ...") and before its "Continuing training ..." lines: alone, the attempt starts from
    # scratch; after a load line it only confirms it.
    _c("hf_running_training", r"\*{5} Running training \*{5}", found=False, detail=True),
    # HF Trainer: "Continuing training from checkpoint, will skip to saved global_step", then
    # "Continuing training from global step 180".
    _c("hf_continue", r"\bContinuing training from checkpoint\b", detail=True),
    _c("hf_global_step", r"\bContinuing training from global step \d+", detail=True),
    # torchtitan: "Finished loading the checkpoint in 61.68 seconds." after "Loading the checkpoint at step 250" or
    # "Loading the checkpoint from ./outputs/checkpoint/step-250."
    _c("finished_loading", r"\bFinished loading the checkpoint\b", detail=True),
    # MMCV/MMEngine: "load checkpoint from local path: work_dirs/run/iter_90000.pth" (also "http path").
    _c("mmcv_load", r"\bload checkpoint from \w+ path: " + _NAME),
    # "loading checkpoint from /ckpt", Megatron's " loading distributed checkpoint from /ckpt at iteration 1000",
    # torchtitan's "Loading the checkpoint at step 1000", DeepSpeed's "[Torch] Loading checkpoint from
    # /ckpt/global_step10/mp_rank_00_model_states.pt..."; not HF's "Loading checkpoint shards", which is
    # pretrained weights, not a resume.
    _c(
        "loading",
        r"\bloading (?:the )?(?:release )?(?:distributed )?checkpoint(?! shards)"
        r"(?:\s+(?:at step \d+|(?:from\s+|at\s+)?" + _NAME + "))?",
    ),
)

#: Every line a ``CHECKPOINT_RULES`` rule matches holds one of these (lower-cased): the cheap test before the
#: regexes (``tests/unit/logs/test_progress.py`` checks it on every rule's example).
CHECKPOINT_WORDS = (
    "checkpoint",
    "resum",
    "scratch",
    "metadata file",
    "continuing training",
    "running training",
    "params",
)

#: The step a checkpoint line names: "step 10", "at iteration 1000", "global_step25000", and in directory names
#: torchtitan's "step-250", HF's "checkpoint-180", Megatron's "iter_0001000", Lightning's "epoch=2-step=3000".
CHECKPOINT_STEP = re.compile(
    r"(?:(?<![\w.])step|(?<![\w.])iteration|global_step)\s*(?:[:=]\s*)?(\d+)"
    r"|(?<![\w.])(?:step-|checkpoint-|iter_)(\d+)",
    re.IGNORECASE,
)
EPOCH = re.compile(r"(?<![\w.])epoch\s*(?:[:=]\s*)?(\d+)", re.IGNORECASE)

#: HF Trainer's training log, a dict printed every ``logging_steps`` optimizer steps:
#: ``{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}``. It names no step, so it is no step
#: line; it does prove that training ran (its ``epoch`` is fractional and grows). Evaluation dicts
#: (``{'eval_loss': ...}``) and the final summary (``{'train_runtime': ...}``) have no ``'loss'`` key first.
TRAINING_LOG = re.compile(r"^\{['\"]loss['\"]: [^{}]*['\"]epoch['\"]: ['\"]?(?P<epoch>\d+(?:\.\d+)?)")
