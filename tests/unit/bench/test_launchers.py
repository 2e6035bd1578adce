"""``rebound bench launchers``: its pure parts (names, load lines, resume facts, scoring of one fault, the table)."""

from __future__ import annotations

import pytest

from deploy.bench.launchers import (
    FAULTS,
    LAUNCHERS,
    FaultResult,
    Observed,
    format_table,
    load_line,
    parse_names,
    report,
    resume_facts,
    resumed_step,
    score_fault,
)
from tests.unit.bench.builders import JOB, RANK0_LOG, T0, drain, incident, requeue, status


def test_parse_names_keeps_the_order_asked_and_rejects_unknown_names() -> None:
    assert parse_names(None, LAUNCHERS, "launcher") == LAUNCHERS
    assert parse_names("torchrun, srun,torchrun", LAUNCHERS, "launcher") == ("torchrun", "srun")
    assert parse_names("all", FAULTS, "fault") == FAULTS
    with pytest.raises(ValueError, match="unknown fault 'oom'"):
        parse_names("xid,oom", FAULTS, "fault")
    with pytest.raises(ValueError, match="no launcher"):
        parse_names(" , ", LAUNCHERS, "launcher")


@pytest.mark.parametrize(
    ("text", "path", "step"),
    [
        ("2026-12-02T05:00:00.000Z [INFO] rank=0/4 node=n1 resumed from checkpoint step_000060 (step 60)",
         "step_000060", 60),
        ("[rank0]:2026-12-02T05:00:00.000Z [INFO] rank=0/4 node=n1 resumed from checkpoint step_000040 (step 40)",
         "step_000040", 40),
        ("resuming from checkpoint /lab/runs/r/checkpoints/checkpoint-80", "/lab/runs/r/checkpoints/checkpoint-80", 80),
        ("Restoring states from the checkpoint path at /lab/runs/r/checkpoints/last.ckpt",
         "/lab/runs/r/checkpoints/last.ckpt", None),
        ("2026-12-02T05:00:00.000Z [INFO] rank=0/4 node=n1 no checkpoint found, starting from step 0", "", 0),
    ],
)  # fmt: skip
def test_load_lines_of_each_trainer(text: str, path: str, step: int | None) -> None:
    found = load_line(text, 7)
    assert found is not None and (found.index, found.path, found.step) == (7, path, step)


def test_a_step_line_is_not_a_load_line() -> None:
    assert load_line("[rank1]:2026-12-02T05:00:00.000Z [INFO] rank=1/4 node=n1 step=12 loss=0.5", 0) is None


def test_resume_facts_measure_from_the_failed_attempts_own_start() -> None:
    # A first attempt that reached step 32 and resumed at 20; the second reaches 27 and is hit at line 7 of it.
    second = [
        "x resumed from checkpoint step_000020 (step 20)",
        "x step=21 loss=1",
        "x step=27 loss=1",
        "x saved checkpoint step_000025 (step 25)",
    ]
    lines = [*RANK0_LOG[:6], *second, "Traceback", "x resumed from checkpoint step_000025 (step 25)", "x step=26 l"]
    facts = resume_facts(lines, fault_index=len(RANK0_LOG[:6]) + len(second))
    assert facts.last_step == 27  # not the first attempt's 32
    assert facts.load is not None and facts.load.step == 25


def test_resume_facts_without_a_resume_yet() -> None:
    facts = resume_facts(RANK0_LOG[:6], fault_index=6)
    assert facts.load is None and facts.last_step == 32


def test_lightning_names_last_ckpt_and_takes_the_step_the_scanner_read() -> None:
    load = load_line("Restoring states from the checkpoint path at /r/checkpoints/last.ckpt", 3)
    assert resumed_step(load, {"step=40.ckpt": 40, "last.ckpt": 40}) == 40
    assert resumed_step(load, {"step=40.ckpt": 40}) is None  # not a valid checkpoint at the restart: unknown
    assert resumed_step(None, {"last.ckpt": 40}) is None


def _observed(fault: str, *incidents: object, **kw: object) -> Observed:
    base: dict[str, object] = {
        "launcher": "torchrun",
        "fault": fault,
        "run": "r",
        "job_id": JOB,
        "t0": T0,
        "target_rank": 2,
        "node": "n2",
        "status": status(*incidents),  # type: ignore[arg-type]
        "before": frozenset(),
        "checkpoint_path": "step_000020",
        "checkpoint_step": 20,
        "log_lines": tuple(RANK0_LOG),
        "fault_index": 8,
    }
    base.update(kw)
    return Observed.model_validate(base)


def test_a_node_crash_that_drained_its_node_and_resumed_at_the_checkpoint_passes() -> None:
    r = score_fault(_observed("node-crash", incident(actions=(drain("n2"), requeue()))))
    assert r.passed, r.error
    assert (r.drained, r.healthy_drained, r.resumed_step, r.last_step, r.lost_steps) == (("n2",), (), 20, 32, 12)
    assert (r.detection_s, r.action_s, r.resume_s) == (0.2, 1.3, 14.0)
    assert r.resume_verified


def test_a_rank_kill_may_exclude_its_node_but_never_drain_it() -> None:
    excluded = score_fault(_observed("rank-kill", incident(actions=(requeue(),))))
    assert excluded.passed, excluded.error
    drained = score_fault(_observed("rank-kill", incident(actions=(drain("n2"), requeue()))))
    assert not drained.passed and drained.healthy_drained == ("n2",)


def test_a_hang_blaming_no_node_passes_but_the_wrong_node_fails() -> None:
    assert score_fault(_observed("hang", incident(nodes=()))).passed
    wrong = score_fault(_observed("hang", incident(nodes=("n1",))))
    assert not wrong.passed and "blamed n1 (truth n2)" in wrong.error


def test_an_xid_must_name_its_node() -> None:
    r = score_fault(_observed("xid", incident(nodes=())))
    assert not r.passed and "blamed no node" in r.error


def test_a_resume_before_the_latest_checkpoint_is_not_verified() -> None:
    r = score_fault(_observed("node-crash", incident(), checkpoint_step=40))
    assert not r.passed and "resume not verified: loaded step 20, latest valid checkpoint step 40" in r.error


def test_a_drain_sinfo_shows_since_the_fault_counts_one_from_before_does_not() -> None:
    r = score_fault(_observed("xid", incident(), drained_before=frozenset({"n4"}), drained_after={"n4", "n3"}))
    assert r.healthy_drained == ("n3",) and not r.passed


def test_no_incident_in_time_fails_and_the_table_and_report_say_so() -> None:
    r = score_fault(_observed("hang", timed_out=True))
    assert not r.passed and r.error.startswith("timeout: no incident recorded after the fault")
    ok = score_fault(_observed("node-crash", incident(actions=(drain("n2"), requeue()))))
    table = format_table([ok, r, FaultResult(launcher="hf", fault="xid", run="r", error="not run")])
    assert "torchrun  node-crash  pass" in table and "FAIL" in table
    out = report([ok, r])
    assert (out["passed"], out["total"], out["healthy_drains"]) == (1, 2, 0)


def test_the_incidents_own_checkpoint_record_is_the_one_to_resume_from() -> None:
    from workflows.domain.checkpoints import CheckpointFormat, CheckpointRef
    from workflows.domain.resume_point import RestartCheckpoint

    ref = CheckpointRef(path="/c/step_000040", step=40, saved_at=None, format=CheckpointFormat.REBOUND_DEMO)
    inc = incident().model_copy(update={"checkpoint": RestartCheckpoint(dir="/c", latest_valid=ref)})
    r = score_fault(_observed("node-crash", inc))  # the bench's own scan said 20; Rebound recorded 40
    assert (r.checkpoint_step, r.checkpoint_source) == (40, "rebound")
    assert not r.passed and "loaded step 20, latest valid checkpoint step 40" in r.error
