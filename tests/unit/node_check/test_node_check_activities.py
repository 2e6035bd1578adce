"""The node check's activities against the fake scheduler and a fake set of maintenance commands: the sequence,
its idempotency after a crash (a leftover reservation reused, the check's job adopted), someone else's drain
left alone, Rebound's own timeout, and the release."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.slurm.maintenance import CheckJobRequest, Reservation
from activities.slurm.node_check import CHECK_COMMENT_PREFIX, NodeCheckActivities
from tests.fakes.scheduler import FakeScheduler
from workflows.domain.node_check import (
    RANK_REPORT_PREFIX,
    CheckOutcome,
    NodeCheckReleaseInput,
    NodeCheckRunInput,
    ProbeResult,
    RankReport,
    reservation_name,
)
from workflows.domain.slurm import JobState

OURS = "rebound: 42-1 xid-79"


class FakeMaintenance:
    """Reservations in a dict; a submitted check job starts on the fake scheduler and, unless it hangs, prints
    every rank's report into its output file."""

    def __init__(self, sched: FakeScheduler, *, hang: bool = False) -> None:
        self.sched = sched
        self.hang = hang
        self.reservations: dict[str, Reservation] = {}
        self.calls: list[str] = []

    async def show_reservation(self, name: str) -> Reservation | None:
        return self.reservations.get(name)

    async def create_reservation(self, name: str, node: str, minutes: int, user: str) -> None:
        self.calls.append(f"create {name}")
        self.reservations[name] = Reservation(name=name, nodes=node, flags="MAINT,IGNORE_JOBS", users=user)

    async def delete_reservation(self, name: str) -> None:
        self.calls.append(f"delete {name}")
        self.reservations.pop(name, None)

    async def submit_check(self, request: CheckJobRequest) -> int:
        assert request.reservation in self.reservations
        job = self.sched.submit([request.node], name="rebound-check", comment=request.comment)
        self.calls.append(f"submit {job.job_id}")
        if not self.hang:
            lines = [
                RANK_REPORT_PREFIX
                + RankReport(
                    node=request.node,
                    rank=r,
                    world=request.ranks,
                    probes=(ProbeResult(name="gloo-all-reduce", ok=True),),
                ).model_dump_json()
                for r in range(request.ranks)
            ]
            _write(Path(request.output.replace("%j", str(job.job_id))), "\n".join(lines) + "\n")
            self.sched.jobs[job.job_id] = job.model_copy(update={"state": JobState.COMPLETED})
        return job.job_id

    async def cancel(self, job_id: int) -> None:
        self.calls.append(f"cancel {job_id}")
        self.sched.jobs[job_id] = self.sched.jobs[job_id].model_copy(update={"state": JobState.CANCELLED})


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _inp(timeout_s: float = 30) -> NodeCheckRunInput:
    return NodeCheckRunInput(node="n2", drain_reason=OURS, token="fleet/check-n2-0", timeout_s=timeout_s, ranks=2)


def _acts(sched: FakeScheduler, maint: FakeMaintenance, tmp_path: Path) -> NodeCheckActivities:
    return NodeCheckActivities(sched, maint, command=("check",), output_dir=tmp_path, user="root", poll_s=0.01)


async def test_a_drained_node_is_reserved_resumed_and_checked(tmp_path: Path) -> None:
    sched = FakeScheduler()
    await sched.drain_node("n2", OURS)
    maint = FakeMaintenance(sched)
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp())
    assert result.outcome is CheckOutcome.PASSED and result.reservation == reservation_name("n2"), result
    assert maint.calls[:2] == ["create rebound-check-n2", f"submit {result.job_id}"]
    assert not sched.nodes["n2"].is_drained  # resumed inside the reservation, which the release ends
    assert reservation_name("n2") in maint.reservations


async def test_a_retry_after_a_crash_reuses_the_reservation_and_adopts_the_job(tmp_path: Path) -> None:
    sched = FakeScheduler()
    maint = FakeMaintenance(sched)
    # What a crashed attempt left: the node resumed inside its reservation, the check job submitted.
    maint.reservations[reservation_name("n2")] = Reservation(name=reservation_name("n2"), nodes="n2")
    job_id = await maint.submit_check(
        CheckJobRequest(
            node="n2", reservation=reservation_name("n2"), ranks=2, time_limit_min=2,
            comment=f"{CHECK_COMMENT_PREFIX}fleet/check-n2-0", output=str(tmp_path / "check-n2-%j.out"), command=("c",),
        )
    )  # fmt: skip
    maint.calls.clear()
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp())
    assert result.outcome is CheckOutcome.PASSED and result.job_id == job_id
    assert maint.calls == [], maint.calls  # nothing created, nothing submitted again


async def test_an_older_check_job_on_the_node_is_cancelled(tmp_path: Path) -> None:
    sched = FakeScheduler()
    await sched.drain_node("n2", OURS)
    old = sched.submit(["n2"], name="rebound-check", comment=f"{CHECK_COMMENT_PREFIX}fleet/check-n2-old")
    maint = FakeMaintenance(sched)
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp())
    assert f"cancel {old.job_id}" in maint.calls and result.job_id != old.job_id


async def test_someone_elses_drain_is_left_alone_and_our_leftover_reservation_goes(tmp_path: Path) -> None:
    sched = FakeScheduler()
    await sched.drain_node("n2", "NHC: check_hw_mem failed")
    maint = FakeMaintenance(sched)
    maint.reservations[reservation_name("n2")] = Reservation(name=reservation_name("n2"), nodes="n2")
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp())
    assert result.outcome is CheckOutcome.NOT_OURS and result.current_reason == "NHC: check_hw_mem failed"
    assert sched.nodes["n2"].reason == "NHC: check_hw_mem failed" and sched.nodes["n2"].is_drained
    assert maint.calls == ["delete rebound-check-n2"] and not result.reservation


async def test_a_hanging_check_is_bounded_by_rebounds_timeout_and_cancelled(tmp_path: Path) -> None:
    sched = FakeScheduler()
    await sched.drain_node("n2", OURS)
    maint = FakeMaintenance(sched, hang=True)
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp(timeout_s=0.2))
    assert result.outcome is CheckOutcome.FAILED and "did not finish within 0.2 s" in result.detail, result
    assert f"cancel {result.job_id}" in maint.calls


@pytest.mark.parametrize("drain", ["", "rebound: held for repair: node check job 7 failed: x"])
async def test_release_drains_first_when_asked_then_deletes_the_reservation(tmp_path: Path, drain: str) -> None:
    sched = FakeScheduler()
    maint = FakeMaintenance(sched)
    maint.reservations[reservation_name("n2")] = Reservation(name=reservation_name("n2"), nodes="n2")
    inp = NodeCheckReleaseInput(node="n2", drain_reason=drain, reservation=reservation_name("n2"))
    done = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).release, inp)
    assert not maint.reservations and done.drained == bool(drain)
    assert sched.nodes["n2"].is_drained == bool(drain) and (not drain or sched.nodes["n2"].reason == drain)


async def test_release_keeps_someone_elses_drain_and_says_whose(tmp_path: Path) -> None:
    sched = FakeScheduler()
    await sched.drain_node("n2", "NHC: fan failed")
    maint = FakeMaintenance(sched)
    inp = NodeCheckReleaseInput(node="n2", drain_reason="rebound: held x", reservation=reservation_name("n2"))
    done = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).release, inp)
    assert not done.drained and done.current_reason == "NHC: fan failed"
    assert sched.nodes["n2"].reason == "NHC: fan failed"


async def test_a_passed_check_waits_for_its_job_to_end_before_answering(tmp_path: Path) -> None:
    """Slurm refuses to delete a reservation while its job is still ending ("Requested reservation is in use")."""
    sched = FakeScheduler()
    await sched.drain_node("n2", OURS)
    maint = FakeMaintenance(sched)
    submit = maint.submit_check

    async def still_running(request: CheckJobRequest) -> int:
        job_id = await submit(request)
        sched.jobs[job_id] = sched.jobs[job_id].model_copy(update={"state": JobState.RUNNING})
        asyncio.get_running_loop().call_later(
            0.2,
            lambda: sched.jobs.update({job_id: sched.jobs[job_id].model_copy(update={"state": JobState.COMPLETED})}),
        )
        return job_id

    maint.submit_check = still_running  # type: ignore[method-assign]  # the job ends a moment after its ranks print
    result = await ActivityEnvironment().run(_acts(sched, maint, tmp_path).run, _inp())
    assert result.outcome is CheckOutcome.PASSED and sched.jobs[result.job_id or 0].state is JobState.COMPLETED
    assert not [c for c in maint.calls if c.startswith("cancel")], maint.calls
