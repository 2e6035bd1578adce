"""The CLI adapter against fake squeue/sinfo/scontrol scripts: argument lists, idempotency, classification."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.port import RestartRequest, SchedulerPort
from tests.unit.slurm import golden
from tests.unit.slurm.fake_bin import FakeSlurmBin
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState

_ERRORS = golden.scontrol_errors()


@pytest.fixture
def fake(tmp_path: Path) -> FakeSlurmBin:
    return FakeSlurmBin(tmp_path)


async def _kind_of(awaitable: object) -> FailureKind:
    with pytest.raises(ReboundError) as caught:
        await awaitable  # type: ignore[misc]  # any coroutine of the adapter
    return caught.value.kind


def test_is_a_scheduler_port(fake: FakeSlurmBin) -> None:
    assert isinstance(fake.scheduler(), SchedulerPort)


async def test_snapshot_is_one_squeue_and_one_sinfo(fake: FakeSlurmBin) -> None:
    snapshot = await fake.scheduler().snapshot()
    assert sorted(fake.calls()) == [["sinfo", "--json"], ["squeue", "--json", "-a"]]
    assert [j.job_id for j in snapshot.jobs] == [1, 2, 3, 4, 5]
    assert [n.name for n in snapshot.nodes] == ["n1", "n2", "n3", "n4"]
    assert snapshot.observed_at.tzinfo is not None


async def test_get_job_and_node_filter_one_listing(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    job = await scheduler.get_job(4)
    assert job is not None and job.restart_count == 1
    assert await scheduler.get_job(9999) is None
    node = await scheduler.get_node("n2")
    assert node is not None and node.reason == "rebound: xid 79"
    assert await scheduler.get_node("nope") is None
    assert [argv[0] for argv in fake.calls()] == ["squeue", "squeue", "sinfo", "sinfo"]


async def test_ctld_down_is_unreachable_although_squeue_exits_0(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.read("squeue_ctld_down.json"))
    fake.respond("sinfo", stdout=golden.read("sinfo_ctld_down.json"))
    assert await _kind_of(fake.scheduler().snapshot()) is FailureKind.SCHEDULER_UNREACHABLE
    assert len(fake.calls()) == 2  # both ran: one snapshot, one squeue, one sinfo, even when failing


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("squeue: error: Unable to contact slurm controller (connect failure)", FailureKind.SCHEDULER_UNREACHABLE),
        ("squeue: fatal: Unable to process configuration file", FailureKind.CONFIGURATION),
        ("squeue: error: something nobody has seen", FailureKind.SCHEDULER_UNREACHABLE),  # reads retry
        # munge refused the worker: its credentials, not an outage, and not retried like one
        ("slurm_load_jobs error: Protocol authentication error", FailureKind.SCHEDULER_AUTH),
        ('squeue: error: Munge encode failed: Failed to access "/run/munge/munge.sock"', FailureKind.SCHEDULER_AUTH),
    ],
)
async def test_failing_reads(fake: FakeSlurmBin, stderr: str, kind: FailureKind) -> None:
    fake.respond("squeue", stderr=stderr, rc=1)
    assert await _kind_of(fake.scheduler().list_jobs()) is kind


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        ("Slurmctld(primary) at vm is DOWN", FailureKind.SCHEDULER_UNREACHABLE),
        ("scontrol: error: Munge decode failed: Invalid credential", FailureKind.SCHEDULER_AUTH),
    ],
)
async def test_ping_tells_a_refused_credential_from_a_down_controller(
    fake: FakeSlurmBin, output: str, kind: FailureKind
) -> None:
    fake.respond("scontrol", stderr=output, rc=1)
    assert await _kind_of(fake.scheduler().ping()) is kind


async def test_garbage_output_is_a_bad_response(fake: FakeSlurmBin) -> None:
    fake.respond("sinfo", stdout="sinfo: this is not json")
    assert await _kind_of(fake.scheduler().list_nodes()) is FailureKind.SCHEDULER_BAD_RESPONSE


async def test_timeout_kills_the_command(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", sleep_s=30)
    started = time.monotonic()
    assert await _kind_of(fake.scheduler(timeout_s=0.3).list_jobs()) is FailureKind.SCHEDULER_TIMEOUT
    assert time.monotonic() - started < 5


async def test_configuration_errors(tmp_path: Path, fake: FakeSlurmBin) -> None:
    missing_bin = SlurmCliScheduler(bin_dir=tmp_path / "nowhere")
    assert await _kind_of(missing_bin.list_jobs()) is FailureKind.CONFIGURATION
    not_on_path = SlurmCliScheduler(env={"PATH": str(tmp_path / "empty")})
    assert await _kind_of(not_on_path.ping()) is FailureKind.CONFIGURATION
    # Slurm retries a missing SLURM_CONF for 60 s; the adapter refuses at once without running anything.
    conf = SlurmCliScheduler(env={"SLURM_CONF": str(tmp_path / "slurm.conf")}, bin_dir=fake.bin_dir)
    assert await _kind_of(conf.list_jobs()) is FailureKind.CONFIGURATION
    assert fake.calls() == []


async def test_ping(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stdout=_ERRORS["ping_up"]["stdout"])
    await fake.scheduler().ping()
    assert fake.calls() == [["scontrol", "ping"]]
    fake.respond("scontrol", stdout=_ERRORS["ctld_down_ping"]["stdout"], rc=1)
    assert await _kind_of(fake.scheduler().ping()) is FailureKind.SCHEDULER_UNREACHABLE


async def test_drain_passes_the_reason_as_one_argument(fake: FakeSlurmBin) -> None:
    await fake.scheduler().drain_node("n1", "rebound: xid 79 on gpu 3")
    assert fake.calls("scontrol") == [
        ["scontrol", "update", "nodename=n1", "state=drain", "reason=rebound: xid 79 on gpu 3"]
    ]


async def test_drain_is_idempotent_and_never_steals_a_drain(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.drain_node("n2", "rebound: xid 79")  # already drained with this reason
    assert await _kind_of(scheduler.drain_node("n2", "rebound: other")) is FailureKind.NOT_OWNED
    assert await _kind_of(scheduler.drain_node("nope", "rebound: x")) is FailureKind.NODE_NOT_FOUND
    assert await _kind_of(scheduler.drain_node("n1", "  ")) is FailureKind.SCHEDULER_REJECTED
    assert fake.calls("scontrol") == []


async def test_drain_classifies_scontrol_failures(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stderr=_ERRORS["ctld_down_drain"]["stderr"], rc=1)
    assert await _kind_of(fake.scheduler().drain_node("n1", "rebound: x")) is FailureKind.SCHEDULER_UNREACHABLE


async def test_resume(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.resume_node("n1")  # not drained, not down: nothing to do
    assert fake.calls("scontrol") == []
    assert await _kind_of(scheduler.resume_node("n2", expected_reason="rebound: other")) is FailureKind.NOT_OWNED
    await scheduler.resume_node("n2", expected_reason="rebound: xid 79")
    await scheduler.resume_node("n4")  # down
    assert fake.calls("scontrol") == [
        ["scontrol", "update", "nodename=n2", "state=resume"],
        ["scontrol", "update", "nodename=n4", "state=resume"],
    ]


async def test_resume_race_with_someone_else_is_a_no_op(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stderr=_ERRORS["resume_not_drained_node"]["stderr"], rc=1)
    fake.respond("sinfo", stdout=golden.sinfo_with(n2={"state_flags": [], "reason": ""}), call=2)
    await fake.scheduler().resume_node("n2")
    assert [argv[0] for argv in fake.calls()] == ["sinfo", "scontrol", "sinfo"]


async def test_resume_refused_by_slurm(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stderr=_ERRORS["resume_not_drained_node"]["stderr"], rc=1)
    assert await _kind_of(fake.scheduler().resume_node("n2")) is FailureKind.SCHEDULER_REJECTED


async def test_requeue(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.requeue_job(1)
    await scheduler.requeue_job(1, hold=True, expected_restart_count=0)
    assert fake.calls("scontrol") == [["scontrol", "requeue", "1"], ["scontrol", "requeuehold", "1"]]


async def test_requeue_is_idempotent(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.requeue_job(4, expected_restart_count=0)  # restart_cnt is 1: it already happened
    await scheduler.requeue_job(5)  # pending: already waiting to run
    assert fake.calls("scontrol") == []


async def test_requeue_refusals(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"requeue": False}))
    scheduler = fake.scheduler()
    assert await _kind_of(scheduler.requeue_job(1)) is FailureKind.SCHEDULER_REJECTED
    assert await _kind_of(scheduler.requeue_job(9999)) is FailureKind.JOB_NOT_FOUND
    assert fake.calls("scontrol") == []


async def test_requeue_when_ctld_goes_away(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stderr=_ERRORS["ctld_down_requeue"]["stderr"], rc=1)
    assert await _kind_of(fake.scheduler().requeue_job(1)) is FailureKind.SCHEDULER_UNREACHABLE


async def test_requeue_racing_a_requeue_holds_the_pending_job(fake: FakeSlurmBin) -> None:
    fake.respond("scontrol", stderr=_ERRORS["pending_job_requeue"]["stderr"], rc=1, call=1)
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"job_state": "PENDING", "restart_cnt": 1}), call=2)
    await fake.scheduler().requeue_job(1, hold=True)
    assert fake.calls("scontrol") == [["scontrol", "requeuehold", "1"], ["scontrol", "uhold", "1"]]


async def test_requeue_hold_of_a_job_slurm_requeued_itself(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"job_state": "PENDING", "restart_cnt": 1}))
    await fake.scheduler().requeue_job(1, hold=True, expected_restart_count=0)
    assert fake.calls("scontrol") == [["scontrol", "uhold", "1"]]


async def test_requeue_hold_while_completing_is_busy(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"job_state": "COMPLETING", "restart_cnt": 1}))
    kind = await _kind_of(fake.scheduler().requeue_job(1, hold=True, expected_restart_count=0))
    assert kind is FailureKind.SCHEDULER_BUSY and kind.retryable


async def test_exclude_nodes_of_a_pending_job(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.set_excluded_nodes(5, ["n3", "n2", "n3"])
    await scheduler.set_excluded_nodes(5, ["n1"])  # already so
    await scheduler.set_excluded_nodes(5, [])
    assert fake.calls("scontrol") == [
        ["scontrol", "update", "jobid=5", "excnodelist=n[2-3]"],
        ["scontrol", "update", "jobid=5", "excnodelist="],
    ]


async def test_exclude_nodes_refusals(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    assert await _kind_of(scheduler.set_excluded_nodes(1, ["n3"])) is FailureKind.SCHEDULER_REJECTED  # running
    assert await _kind_of(scheduler.set_excluded_nodes(2, ["n3"])) is FailureKind.SCHEDULER_REJECTED  # ended
    assert await _kind_of(scheduler.set_excluded_nodes(5, ["bad[node"])) is FailureKind.SCHEDULER_REJECTED
    assert fake.calls("scontrol") == []
    fake.respond("scontrol", stderr=_ERRORS["excnodelist_unknown_node"]["stderr"], rc=1)
    assert await _kind_of(scheduler.set_excluded_nodes(5, ["nope"])) is FailureKind.NODE_NOT_FOUND
    fake.respond("scontrol", stderr=_ERRORS["running_job_excnodelist"]["stderr"], rc=1)
    assert await _kind_of(scheduler.set_excluded_nodes(5, ["n2"])) is FailureKind.SCHEDULER_BUSY  # it just started


async def test_exclusion_works_while_the_requeue_completes(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"job_state": "COMPLETING", "restart_cnt": 1}))
    await fake.scheduler().set_excluded_nodes(1, ["n2"])
    assert fake.calls("scontrol") == [["scontrol", "update", "jobid=1", "excnodelist=n2"]]


async def test_release(fake: FakeSlurmBin) -> None:
    held = {"job_state": "PENDING", "state_reason": "JobHeldUser", "restart_cnt": 1}
    fake.respond("squeue", stdout=golden.squeue_with(job_1=held))
    scheduler = fake.scheduler()
    await scheduler.release_job(1, start_now=True)
    await scheduler.release_job(5)  # pending but not held: nothing to release
    assert fake.calls("scontrol") == [
        ["scontrol", "update", "jobid=1", "starttime=now"],
        ["scontrol", "release", "1"],
    ]


async def test_release_edge_cases(fake: FakeSlurmBin) -> None:
    scheduler = fake.scheduler()
    await scheduler.release_job(1, start_now=True)  # running: already released and started
    assert await _kind_of(scheduler.release_job(2)) is FailureKind.SCHEDULER_REJECTED  # ended
    assert fake.calls("scontrol") == []
    fake.respond("squeue", stdout=golden.squeue_with(job_1={"job_state": "COMPLETING", "restart_cnt": 1}))
    assert await _kind_of(scheduler.release_job(1, start_now=True)) is FailureKind.SCHEDULER_BUSY


async def test_start_now_racing_the_scheduler(fake: FakeSlurmBin) -> None:
    fake.respond("squeue", stdout=golden.squeue_with(job_5={"state_reason": "JobHeldUser"}))
    fake.respond("scontrol", stderr=_ERRORS["running_job_starttime_now"]["stderr"], rc=1)
    await fake.scheduler().release_job(5, start_now=True)
    assert fake.calls("scontrol") == [["scontrol", "update", "jobid=5", "starttime=now"]]


async def test_state_models_reach_callers(fake: FakeSlurmBin) -> None:
    jobs = await fake.scheduler().list_jobs()
    assert {j.job_id: j.state for j in jobs}[5] is JobState.PENDING


async def test_restart_replaces_a_stale_exclusion_keeping_the_owners(fake: FakeSlurmBin) -> None:
    # squeue --json (22.05) gives the exclusion as one hostlist string: n1 is the owner's, n3 a stale one of ours.
    held = {"job_state": "PENDING", "state_reason": "JobHeldUser", "restart_cnt": 1, "excluded_nodes": "n[1,3]"}
    fake.respond("squeue", stdout=golden.squeue_with(job_5=held))
    request = RestartRequest(job_id=5, exclude=("n4",), user_excluded=("n1",), expected_restart_count=0)
    await fake.scheduler().restart_excluding(request)
    assert fake.calls("scontrol") == [
        ["scontrol", "update", "jobid=5", "excnodelist=n[1,4]"],
        ["scontrol", "release", "5"],
    ]


async def test_restart_leaves_an_exact_exclusion_alone(fake: FakeSlurmBin) -> None:
    held = {"job_state": "PENDING", "state_reason": "JobHeldUser", "restart_cnt": 1, "excluded_nodes": "n[1,4]"}
    fake.respond("squeue", stdout=golden.squeue_with(job_5=held))
    request = RestartRequest(job_id=5, exclude=("n4",), user_excluded=("n1",), expected_restart_count=0)
    await fake.scheduler().restart_excluding(request)
    assert fake.calls("scontrol") == [["scontrol", "release", "5"]]
