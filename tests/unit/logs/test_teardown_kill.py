"""srun's "task N: Killed" while Slurm tears the step down is the teardown's SIGKILL, not a rank's own death.

The lab's Lightning x hang cell: the hung rank (n4) got a SIGTERM and exited 1; srun ended the step; rank 0 on n3
ignored the SIGTERM (Lightning's SLURM handler) and was SIGKILLed after KillWait; srun's "n3: task 0: Killed" was
read as a rank killed on its own, and the healthy n3 was excluded. Line formats from the lab's batch logs
(tests/data/logs/lab-requeue-batch.log) and public logs (tests/data/detection/heldout.jsonl)."""

from __future__ import annotations

from activities.logs.crash import scan, to_findings
from activities.logs.line import LogLine
from activities.logs.signature_types import Role
from workflows.policy.attribution import AttributionFacts, attribute

BATCH = "/runs/r/logs/job-1-batch.log"
TEARDOWN = [
    "srun: launch/slurm: _step_signal: Terminating StepId=1.0",
    "slurmstepd-n3: error: *** STEP 1.0 ON n3 CANCELLED AT 2026-12-05T19:40:29 ***",
]


def _lines(*texts: str) -> list[LogLine]:
    return [LogLine(path=BATCH, rank=None, text=t, offset=i) for i, t in enumerate(texts)]


def test_a_task_killed_after_the_step_was_torn_down_is_a_victim() -> None:
    found = scan(
        _lines("srun: error: n4: task 1: Exited with exit code 1", *TEARDOWN, "srun: error: n3: task 0: Killed")
    )
    killed = [f for f in found if f.rule == "srun_task_killed"]
    assert [(f.rank, f.culprit, f.role) for f in killed] == [(0, False, Role.VICTIM)]
    a = attribute(AttributionFacts(job_nodes=("n3", "n4"), rank_nodes={0: "n3", 1: "n4"}, findings=to_findings(found)))
    assert a.implicated_nodes == ("n4",)  # the rank that ended first, not the one the teardown killed


def test_a_task_killed_before_any_teardown_is_the_culprit() -> None:
    """The bench's rank kill (SIGKILL of rank 1): srun reports it first, then stops the others."""
    found = scan(_lines("srun: error: n2: task 1: Killed", *TEARDOWN, "srun: error: n1: task 0: Terminated"))
    assert [(f.rank, f.culprit) for f in found if f.rule == "srun_task_killed"] == [(1, True)]


def test_the_next_attempts_output_ends_the_teardown() -> None:
    """A batch log appended across attempts: a kill after the next attempt began is that attempt's own."""
    found = scan(
        _lines(
            *TEARDOWN, "srun: error: n1: task 0: Killed", "batch job_id=1 restart=1", "srun: error: n2: task 1: Killed"
        )
    )
    assert [(f.rank, f.culprit) for f in found if f.rule == "srun_task_killed"] == [(0, False), (1, True)]
