"""``rebound bench launchers``: one lab job per launcher taken through real faults one after the other.

Launchers: ``srun`` (the demo, one srun task per rank, a log per rank), ``torchrun`` (the demo under torchrun,
one srun task per node, only ``slurm-%j.out``), ``lightning`` and ``hf`` (real PyTorch Lightning and Hugging Face
Trainer jobs, one srun task per rank). Faults, in the order asked, each once the job trains again (a new valid
checkpoint since the previous restart):

==============  =========================================================  ===================  ============
fault           injected                                                   node to blame        may drain it
==============  =========================================================  ===================  ============
``node-crash``  ``node-crash`` (kill) of the target rank's node            that node            yes
``xid``         ``gpu-fault``: XID 79 on the target rank's GPU, the rank   that node            yes
                then dies of a CUDA error
``rank-kill``   ``kill``: SIGKILL of the target rank's own process (under  that node or none    no (exclude)
                torchrun the worker, never the agent)
``hang``        ``hang``: the target rank blocks; its peers wait in the    that node or none    no
                next collective
==============  =========================================================  ===================  ============

The target is the lowest rank on a node other than rank 0's (``deploy.bench.scenarios.pick_target``). A fault
passes when the incident it opened resumed, the attribution named the right node (or none where none is allowed),
no healthy node was drained, and the job's own load line shows it resumed at the latest valid checkpoint's step
(``rebound checkpoints``' scanner, read when Rebound restarted the job).

This module is pure (the launchers and faults, the load lines, scoring, the report); ``deploy.bench.launchers_run``
is the command and drives the lab with the recovery bench's ``BenchContext``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import Field

from deploy.bench.scenarios import GroundTruth
from deploy.bench.scoring import attribution_correct, failure_reason, false_actions, incidents_after, latencies
from workflows.domain.base import Frozen
from workflows.domain.recovery import JobRecoveryStatus

Launcher = Literal["srun", "torchrun", "lightning", "hf"]
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
Fault = Literal["node-crash", "xid", "rank-kill", "hang"]
FAULTS: tuple[Fault, ...] = get_args(Fault)


class Submission(Frozen):
    """How ``submit_demo`` submits a launcher's job (2 nodes each)."""

    launcher: str
    trainer: str
    tasks_per_node: int
    checkpoint_every: int


#: The demo loop runs 2 x 2 ranks; the real trainers 2 x 1 (as their own lab test: 4 Lightning or transformers
#: processes on the lab's 2 cores take minutes to start), saving every 10 steps.
SUBMIT: dict[Launcher, Submission] = {
    "srun": Submission(launcher="srun", trainer="demo", tasks_per_node=2, checkpoint_every=20),
    "torchrun": Submission(launcher="torchrun", trainer="demo", tasks_per_node=2, checkpoint_every=20),
    "lightning": Submission(launcher="srun", trainer="lightning", tasks_per_node=1, checkpoint_every=10),
    "hf": Submission(launcher="srun", trainer="hf", tasks_per_node=1, checkpoint_every=10),
}
#: Faults whose evidence is the node's own (a dead slurmd, an XID): that node must be named and may be drained.
NODE_LEVEL: frozenset[Fault] = frozenset({"node-crash", "xid"})

_T = TypeVar("_T", bound=str)


def parse_names(text: str | None, allowed: tuple[_T, ...], what: str) -> tuple[_T, ...]:
    """``"torchrun,srun"`` -> those names in that order; None or ``"all"``: every one.

    Raises:
        ValueError: an unknown name, or none given.
    """
    if text is None or text.strip().lower() == "all":
        return allowed
    out: list[_T] = []
    for part in (p.strip() for p in text.split(",")):
        match = next((a for a in allowed if a == part), None)
        if part and match is None:
            raise ValueError(f"unknown {what} {part!r}: choose from {', '.join(allowed)}")
        if match is not None and match not in out:
            out.append(match)
    if not out:
        raise ValueError(f"no {what} given")
    return tuple(out)


# ----- the job's own lines ------------------------------------------------------------------------------------------

_DEMO_LOAD = re.compile(r"resumed from checkpoint (?P<path>\S+) \(step (?P<step>\d+)\)")
_DEMO_SCRATCH = re.compile(r"no checkpoint found")
_HF_LOAD = re.compile(r"resuming from checkpoint (?P<path>\S*?checkpoint-(?P<step>\d+))\b")
_PL_LOAD = re.compile(
    r"(?:Restoring states from the checkpoint path at|Restored all states from the checkpoint at) (?P<path>\S+)"
)
_STEP = re.compile(r"\bstep=(?P<step>\d+) ")


class LoadLine(Frozen):
    """Where an attempt's log says it loaded its checkpoint from; ``path`` empty: it started from scratch."""

    index: int
    path: str = ""
    step: int | None = None


def load_line(line: str, index: int) -> LoadLine | None:
    """The load (or start-from-scratch) line of the demo, torchrun's ``[rankN]:`` copy of it, HF or Lightning."""
    if m := _DEMO_LOAD.search(line):
        return LoadLine(index=index, path=m["path"], step=int(m["step"]))
    if m := _HF_LOAD.search(line):
        return LoadLine(index=index, path=m["path"], step=int(m["step"]))
    if m := _PL_LOAD.search(line):
        return LoadLine(index=index, path=m["path"])
    if _DEMO_SCRATCH.search(line):
        return LoadLine(index=index, step=0)
    return None


class ResumeFacts(Frozen):
    last_step: int | None = None
    """The furthest ``step=N`` the failed attempt logged (None: the job logs no step lines)."""
    load: LoadLine | None = None
    """The first load line after the fault: the resuming attempt's."""


def resume_facts(lines: Sequence[str], fault_index: int) -> ResumeFacts:
    """From one log (all attempts appended): the failed attempt runs from its own load line (the last before
    ``fault_index``, the line count when the fault was injected) to the resuming attempt's load line."""
    loads = [ln for i, text in enumerate(lines) if (ln := load_line(text, i)) is not None]
    start = max((ln.index for ln in loads if ln.index < fault_index), default=0)
    resumed = next((ln for ln in loads if ln.index >= fault_index), None)
    end = resumed.index if resumed is not None else len(lines)
    steps = [int(m["step"]) for text in lines[start:end] if (m := _STEP.search(text))]
    return ResumeFacts(last_step=max(steps) if steps else None, load=resumed)


def resumed_step(load: LoadLine | None, valid_steps: Mapping[str, int]) -> int | None:
    """The step the resuming attempt loaded: its load line's, else (Lightning names ``last.ckpt``, not a step) the
    step of the valid checkpoint of that file name the scanner read when Rebound restarted the job."""
    if load is None:
        return None
    if load.step is not None:
        return load.step
    return valid_steps.get(Path(load.path).name) if load.path else None


# ----- one fault, scored --------------------------------------------------------------------------------------------


class FaultResult(Frozen):
    launcher: Launcher
    fault: Fault
    run: str
    job_id: int | None = None
    passed: bool = False
    error: str = ""
    t0: datetime | None = None
    target_rank: int | None = None
    truth_node: str | None = None
    cause: str = ""
    implicated_nodes: tuple[str, ...] = ()
    attribution_right: bool = False
    drained: tuple[str, ...] = ()
    """Nodes drained for this fault (the incidents' drains and sinfo's ``rebound: <job>-`` reasons, new since t0)."""
    healthy_drained: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    """The job's excluded nodes after the restart (Slurm's ExcNodeList)."""
    detection_s: float | None = None
    action_s: float | None = None
    resume_s: float | None = None
    checkpoint_step: int | None = None
    """The latest valid checkpoint's step when Rebound restarted the job: the incident's record, else the bench's
    scan at the restart (``checkpoint_source``)."""
    checkpoint_path: str = ""
    checkpoint_source: str = ""
    rebound_resume_point: str = ""
    """Rebound's own verdict on where the restarted job started (``ResumePoint``), when it gave one."""
    resumed_step: int | None = None
    resumed_from: str = ""
    resume_verified: bool = False
    last_step: int | None = None
    lost_steps: int | None = None
    false_action_details: tuple[str, ...] = ()
    wall_s: float = 0.0


class Observed(Frozen):
    """What the runner saw of one fault; ``score_fault`` judges it."""

    launcher: Launcher
    fault: Fault
    run: str
    job_id: int
    t0: datetime
    target_rank: int | None
    node: str
    status: JobRecoveryStatus | None
    before: frozenset[int]
    drained_before: frozenset[str] = frozenset()
    drained_after: frozenset[str] = frozenset()
    excluded: tuple[str, ...] = ()
    checkpoint_path: str = ""
    checkpoint_step: int | None = None
    valid_steps: dict[str, int] = Field(default_factory=dict)
    """Every valid checkpoint's step by file name, as the scanner read them at the restart."""
    log_lines: tuple[str, ...] = ()
    fault_index: int = 0
    timed_out: bool = False
    wall_s: float = Field(0.0, ge=0)


def score_fault(o: Observed) -> FaultResult:
    """Judge one fault against its truth (module docstring)."""
    truth = GroundTruth(node=o.node, restart=True)
    incidents = incidents_after(o.status, o.before) if o.status is not None else []
    first = incidents[0] if incidents else None
    att = first.attribution if first is not None else None
    implicated = att.implicated_nodes if att is not None else ()
    if o.fault in NODE_LEVEL:
        right = attribution_correct(truth, first)
    else:
        right = att is not None and set(implicated) <= {o.node}
    allowed = {o.node} if o.fault in NODE_LEVEL else set()
    # Drains of this fault: sinfo's new ones, and what the incidents recorded.
    drain_truth = GroundTruth(node=o.node if o.fault in NODE_LEVEL else None, restart=True)
    wrong = false_actions(drain_truth, incidents, rebound_drains=o.drained_after - o.drained_before)
    drained = sorted(
        (o.drained_after - o.drained_before)
        | {a.target for i in incidents for a in i.actions if a.kind.value == "drain"}
    )
    healthy = tuple(n for n in drained if n not in allowed)
    wrong = [w for w in wrong if w.startswith("drained")]
    lat = latencies(o.t0, incidents)
    resumed_inc = next((i for i in incidents if i.resumed_at is not None), None)
    # The checkpoint to resume from: Rebound's own record before the restart, else the bench's scan at the restart.
    recorded = next((i.checkpoint for i in (resumed_inc, first) if i is not None and i.checkpoint is not None), None)
    ref = recorded.latest_valid if recorded is not None else None
    ckpt_step, ckpt_path = (ref.step, ref.path) if ref is not None else (o.checkpoint_step, o.checkpoint_path)
    facts = resume_facts(o.log_lines, o.fault_index)
    step = resumed_step(facts.load, o.valid_steps)
    verified = step is not None and ckpt_step is not None and step == ckpt_step
    lost = max(0, facts.last_step - step) if facts.last_step is not None and step is not None else None
    reasons = [failure_reason(truth, o.status, o.before)]
    if o.timed_out and reasons[0]:
        reasons[0] = f"timeout: {reasons[0]}"
    if att is not None and not right:
        reasons.append(f"blamed {','.join(implicated) or 'no node'} (truth {o.node})")
    if healthy:
        reasons.append(f"drained healthy {','.join(healthy)}")
    if not reasons[0] and not verified:
        seen = f"loaded step {step}" if step is not None else "no load line with a step"
        reasons.append(f"resume not verified: {seen}, latest valid checkpoint step {ckpt_step}")
    error = "; ".join(r for r in reasons if r)
    return FaultResult(
        launcher=o.launcher,
        fault=o.fault,
        run=o.run,
        job_id=o.job_id,
        passed=not error,
        error=error,
        t0=o.t0,
        target_rank=o.target_rank,
        truth_node=o.node,
        cause=att.cause if att is not None else "",
        implicated_nodes=implicated,
        attribution_right=right,
        drained=tuple(drained),
        healthy_drained=healthy,
        excluded=o.excluded,
        detection_s=lat.detection_s,
        action_s=lat.action_s,
        resume_s=lat.resume_s,
        checkpoint_step=ckpt_step,
        checkpoint_path=ckpt_path,
        checkpoint_source="rebound" if ref is not None else ("bench scan" if o.checkpoint_step is not None else ""),
        rebound_resume_point=resumed_inc.resume_point.value if resumed_inc and resumed_inc.resume_point else "",
        resumed_step=step,
        resumed_from=(facts.load.path if facts.load is not None else "")
        or (resumed_inc.resumed_from if resumed_inc else ""),
        resume_verified=verified,
        last_step=facts.last_step,
        lost_steps=lost,
        false_action_details=tuple(wrong),
        wall_s=round(o.wall_s, 1),
    )


# ----- report -------------------------------------------------------------------------------------------------------


def _num(v: float | int | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    return str(v) if isinstance(v, int) else f"{v:.{digits}f}"


def format_table(results: Iterable[FaultResult]) -> str:
    """One row per (launcher, fault)."""
    header = [
        "launcher",
        "fault",
        "result",
        "blamed (truth)",
        "drained",
        "excluded",
        "detect s",
        "action s",
        "resume s",
        "ckpt step",
        "resumed",
        "lost",
    ]
    rows = [header]
    for r in results:
        rows.append(
            [
                r.launcher,
                r.fault,
                "pass" if r.passed else "FAIL",
                f"{','.join(r.implicated_nodes) or '-'} ({r.truth_node or '-'})",
                ",".join(r.drained) or "-",
                ",".join(r.excluded) or "-",
                _num(r.detection_s),
                _num(r.action_s),
                _num(r.resume_s),
                _num(r.checkpoint_step),
                _num(r.resumed_step),
                _num(r.lost_steps),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def report(results: Sequence[FaultResult]) -> dict[str, Any]:
    return {
        "passed": sum(r.passed for r in results),
        "total": len(results),
        "healthy_drains": sum(len(r.healthy_drained) for r in results),
        "results": [r.model_dump(mode="json") for r in results],
    }


def failures(results: Iterable[FaultResult]) -> list[str]:
    return [f"{r.launcher} x {r.fault}: {r.error}" for r in results if not r.passed]
