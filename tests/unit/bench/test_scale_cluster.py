"""The scale benchmark's synthetic cluster: its listings go through Rebound's real parser, and the scheduler
commands Rebound issues move its jobs and nodes as Slurm 22.05 does (deploy/scale/cluster.py)."""

from __future__ import annotations

import json
from pathlib import Path

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from activities.slurm.port import RestartRequest
from deploy.scale.cluster import JobChange, SyntheticCluster
from deploy.scale.scheduler import FakeSlurm
from workflows.domain.slurm import JobState, NodeBaseState
from workflows.policy.optin import parse_comment

NOW = 1_800_000_000.0


def _cluster(jobs: int = 3, spare: int = 2) -> SyntheticCluster:
    return SyntheticCluster.create(
        jobs=jobs, ranks=8, spare_nodes=spare, log_root="/dev/shm/s/logs", user=("alice", 1234), now=NOW
    )


def _jobs(c: SyntheticCluster):  # type: ignore[no-untyped-def]
    return {j.job_id: j for j in parse_jobs(load_payload(json.dumps(c.squeue()), source="squeue --json"))}


def _nodes(c: SyntheticCluster):  # type: ignore[no-untyped-def]
    return {n.name: n for n in parse_nodes(load_payload(json.dumps(c.sinfo()), source="sinfo --json"))}


def test_listings_parse_as_running_opted_in_jobs_on_their_own_nodes() -> None:
    c = _cluster()
    jobs, nodes = _jobs(c), _nodes(c)
    assert sorted(jobs) == [1000, 1001, 1002]
    job = jobs[1001]
    assert job.state is JobState.RUNNING and job.nodes == ("g00002",) and job.user_id == 1234
    assert job.requeue_allowed and job.restart_count == 0
    spec = parse_comment(job.comment)
    assert spec is not None and spec.logs == ("/dev/shm/s/logs/job-%j/rank-%t.log",)
    assert nodes["g00002"].state is NodeBaseState.ALLOCATED
    assert nodes["g00005"].state is NodeBaseState.IDLE  # a spare


def test_a_record_is_the_size_of_a_real_one() -> None:
    size = len(json.dumps(_cluster(jobs=1).squeue()["jobs"][0], indent=3))
    assert 2_000 < size < 6_000  # 22.05 prints ~2.7 KB a job (27 MB at 10,000 jobs, issue 12)


def test_requeue_hold_exclude_release_restarts_the_job_elsewhere_with_restart_count_plus_one() -> None:
    c = _cluster()
    out = c.scontrol(["requeuehold", "1000"], NOW)
    assert out.returncode == 0 and out.changes == (JobChange(1000, running=False),)
    job = _jobs(c)[1000]
    assert job.state is JobState.PENDING and job.state_reason == "JobHeldUser" and job.restart_count == 1
    assert c.scontrol(["update", "jobid=1000", "excnodelist=g00001"], NOW).returncode == 0
    assert c.scontrol(["update", "jobid=1000", "starttime=now"], NOW).returncode == 0
    assert c.scontrol(["release", "1000"], NOW).returncode == 0
    assert c.tick(NOW + 0.5) == ()  # starttime=now still waits a second
    started = c.tick(NOW + 1.0)
    assert started == (JobChange(1000, running=True, node="g00004", restart_count=1),)
    job = _jobs(c)[1000]
    assert job.state is JobState.RUNNING and job.nodes == ("g00004",) and job.excluded_nodes == ("g00001",)


def test_a_requeued_job_without_exclusion_returns_to_its_node_after_the_start_delay() -> None:
    c = _cluster()
    c.fail(1002)
    assert _jobs(c)[1002].state is JobState.FAILED
    c.scontrol(["requeue", "1002"], NOW)
    assert c.tick(NOW + 1) == ()
    assert c.tick(NOW + c.start_delay_s) == (JobChange(1002, running=True, node="g00003", restart_count=1),)


def test_no_free_node_leaves_the_job_pending_for_resources() -> None:
    c = _cluster(jobs=2, spare=0)
    c.scontrol(["requeue", "1000"], NOW)
    c.scontrol(["update", "jobid=1000", "excnodelist=g00001"], NOW)
    assert c.tick(NOW + 60) == ()
    assert _jobs(c)[1000].state_reason == "Resources"


def test_drain_and_resume_show_in_sinfo_with_slurms_refusals() -> None:
    c = _cluster()
    assert c.scontrol(["update", "nodename=g00002", "state=drain"], NOW).stderr.startswith("You must specify a reason")
    assert c.scontrol(["update", "nodename=g00002", "state=resume"], NOW).stderr.strip() == (
        "slurm_update error: Invalid node state specified"
    )
    assert (
        c.scontrol(["update", "nodename=g00002", "state=drain", "reason=rebound: 1001-1 xid-79"], NOW).returncode == 0
    )
    node = _nodes(c)["g00002"]
    assert node.is_drained and node.reason == "rebound: 1001-1 xid-79" and node.reason_set_by_user == "root"
    assert c.scontrol(["update", "nodename=g00002", "state=resume"], NOW).returncode == 0
    assert not _nodes(c)["g00002"].is_drained
    assert "Invalid node name" in c.scontrol(["update", "nodename=nope", "state=drain", "reason=x"], NOW).stderr


def test_slurms_refusals_for_jobs() -> None:
    c = _cluster()
    assert c.scontrol(["requeue", "9999"], NOW).stderr == "Invalid job id specified for job 9999\n"
    assert "no longer pending" in c.scontrol(["update", "jobid=1000", "excnodelist=g00002"], NOW).stderr
    c.scontrol(["requeue", "1000"], NOW)
    assert c.scontrol(["requeue", "1000"], NOW).stderr == "Job is pending execution for job 1000\n"


def test_a_command_the_model_does_not_know_is_refused_and_counted() -> None:
    c = _cluster()
    out = c.scontrol(["suspend", "1000"], NOW)
    assert out.returncode == 1 and c.unknown_commands == ["suspend 1000"]


async def test_the_real_cli_adapter_restarts_and_drains_through_the_fake_commands(tmp_path: Path) -> None:
    c = _cluster()
    changes: list[JobChange] = []
    fake = FakeSlurm(c, tmp_path, changes.append)
    fake.install()
    await fake.start()
    try:
        cli = SlurmCliScheduler(env={"PATH": "/usr/bin:/bin"}, bin_dir=fake.bin_dir)
        await cli.drain_node("g00001", "rebound: 1000-1 xid-79")
        result = await cli.restart_excluding(
            RestartRequest(job_id=1000, expected_restart_count=0, exclude=("g00001",), previous_nodes=("g00001",))
        )
        assert result.state is JobState.PENDING and result.started_now
        fake.cluster.tick(NOW + 10**6)  # its wait is over
        fake.publish()
        job = await cli.get_job(1000)
        assert job is not None and job.state is JobState.RUNNING and job.restart_count == 1
        assert job.nodes == ("g00004",) and job.excluded_nodes == ("g00001",)
        node = await cli.get_node("g00001")
        assert node is not None and node.is_drained
    finally:
        await fake.stop()
    verbs = [c["argv"][0] for c in fake.commands]
    assert verbs == ["update", "requeuehold", "update", "update", "release"]
    assert changes == [JobChange(1000, running=False)]
