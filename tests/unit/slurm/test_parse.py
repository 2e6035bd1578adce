"""Parsing golden ``squeue --json``/``sinfo --json``/slurmrestd captures into domain models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from activities.slurm.parse import (
    decode_exit_status,
    epoch_to_datetime,
    expand_output_path,
    job_state,
    load_payload,
    node_state,
    parse_job,
    parse_jobs,
    parse_node,
    parse_nodes,
)
from tests.unit.slurm import golden
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState, NodeBaseState, SlurmJob


def _jobs(name: str = "squeue.json") -> dict[int, SlurmJob]:
    return {job.job_id: job for job in parse_jobs(load_payload(golden.read(name), source=name))}


def test_running_multi_node_job() -> None:
    job = _jobs()[1]
    assert job.state is JobState.RUNNING
    assert job.nodes == ("n1", "n2")
    assert job.batch_host == "n1"
    assert (job.node_count, job.task_count, job.restart_count) == (2, 2, 0)
    assert job.requeue_allowed
    assert job.comment == "rebound:watch"
    assert job.tres_per_node == "gres:gpu:2"
    assert job.state_reason == ""  # Slurm's "None"
    assert job.standard_output == job.standard_error == "/lab/jobs/train-1.out"  # "%j" filled in, stderr joined
    assert job.start_time == datetime(2026, 11, 30, 3, 27, 36, tzinfo=UTC)
    assert job.end_time is None  # Slurm says 1827545256: start + the 365-day limit
    assert job.exit_code is None and job.exit_signal is None


def test_failed_jobs_decode_the_wait_status() -> None:
    jobs = _jobs()
    assert (jobs[2].state, jobs[2].state_reason, jobs[2].exit_code, jobs[2].exit_signal) == (
        JobState.FAILED,
        "NonZeroExitCode",
        3,  # raw 768
        None,
    )
    assert (jobs[3].exit_code, jobs[3].exit_signal) == (None, 9)  # raw 9: SIGKILL
    assert jobs[2].end_time == datetime(2026, 11, 30, 3, 27, 36, tzinfo=UTC)


def test_requeued_job_runs_again_with_restart_count() -> None:
    job = _jobs()[4]
    assert (job.state, job.restart_count, job.nodes, job.required_nodes) == (JobState.RUNNING, 1, ("n3",), ("n3",))
    assert job.eligible_time is not None and job.submit_time is not None
    assert job.eligible_time > job.submit_time  # held cred_expire + 1 s after the requeue


def test_pending_job_with_excluded_nodes() -> None:
    job = _jobs()[5]
    assert job.state is JobState.PENDING
    assert job.excluded_nodes == ("n1",)
    assert job.nodes == ()
    assert job.state_reason == "Resources"
    assert job.state_description.startswith("Nodes required for job are DOWN, DRAINED")
    assert job.start_time is None and job.end_time is None


def test_requeue_while_completing() -> None:
    job = _jobs("squeue_requeue_completing.json")[10]
    assert (job.state, job.restart_count, job.nodes) == (JobState.COMPLETING, 1, ("n4",))
    assert job.end_time is None  # Slurm says 6090976773 (year 2163)
    assert job.exit_code is None
    assert _jobs("squeue_requeue_completing.json")[7].standard_output == "/lab/jobs/slurm-7.out"  # sbatch default


def test_a_completing_job_keeps_its_whole_allocation() -> None:
    """Captured on the lab: a 2-node job cancelled, n1 done, n2 still completing (its task ignored SIGTERM)."""
    [job] = _jobs("squeue_completing_partial.json").values()
    assert (job.state, job.nodes, job.allocated_nodes) == (JobState.COMPLETING, ("n2",), ("n1", "n2"))
    running = _jobs("squeue_requeue_completing.json")
    assert all(j.allocated_nodes == () for j in running.values() if j.state is not JobState.COMPLETING)


def test_nodes_mixed_drained_down() -> None:
    payload = load_payload(golden.read("sinfo.json"), source="sinfo")
    nodes = {node.name: node for node in parse_nodes(payload)}
    assert set(nodes) == {"n1", "n2", "n3", "n4"}  # once each, although n3/n4 are in two partitions
    assert nodes["n1"].state is NodeBaseState.MIXED and nodes["n1"].is_usable
    assert nodes["n1"].reason_changed_at is None and nodes["n1"].reason_set_by_user == ""
    n2 = nodes["n2"]
    assert (n2.state, n2.flags, n2.reason, n2.reason_set_by_user) == (
        NodeBaseState.MIXED,
        ("DRAIN",),
        "rebound: xid 79",
        "root",
    )
    assert n2.is_drained and not n2.is_usable
    assert n2.reason_changed_at == datetime(2026, 11, 30, 3, 27, 39, tzinfo=UTC)
    n4 = nodes["n4"]
    assert (n4.state, n4.flags, n4.reason) == (NodeBaseState.DOWN, ("NOT_RESPONDING",), "Not responding")
    assert not n4.is_responding
    assert nodes["n3"].partitions == ("main", "debug")
    assert (nodes["n1"].gres, nodes["n1"].gres_used, nodes["n1"].cpus, nodes["n1"].alloc_cpus) == (
        "gpu:4",
        "gpu:2",
        4,
        1,
    )


def test_drained_idle_resumed_and_completing_nodes() -> None:
    def nodes(name: str) -> dict[str, Any]:
        return {n.name: n for n in parse_nodes(load_payload(golden.read(name), source=name))}

    drained = nodes("sinfo_drained.json")["n4"]
    assert (drained.state, drained.flags, drained.reason) == (NodeBaseState.IDLE, ("DRAIN",), "maintenance by ops")
    resumed = nodes("sinfo_resumed_immediately.json")["n4"]
    # For about 0.5 s after a resume Slurm shows idle* until it pings the node.
    assert (resumed.state, resumed.flags, resumed.is_drained, resumed.is_usable) == (
        NodeBaseState.IDLE,
        ("NOT_RESPONDING",),
        False,
        False,
    )
    assert nodes("sinfo_completing.json")["n4"].flags == ("COMPLETING",)


def test_rest_payloads_parse_like_the_cli() -> None:
    one = parse_jobs(load_payload(golden.read("rest_job_1.json"), source="rest"))
    assert [j.job_id for j in one] == [1]
    assert one[0] == _jobs()[1]
    node = parse_nodes(load_payload(golden.read("rest_node_n2.json"), source="rest"))
    assert node[0].reason == "rebound: xid 79"


@pytest.mark.parametrize(
    ("capture", "kind"),
    [
        ("squeue_ctld_down.json", FailureKind.SCHEDULER_UNREACHABLE),
        ("rest_ctld_down_jobs.json", FailureKind.SCHEDULER_UNREACHABLE),
        ("rest_ctld_down_job_1.json", FailureKind.SCHEDULER_UNREACHABLE),  # -1, not 2017: not "unknown job"
        ("rest_jwt_bad_token.json", FailureKind.SCHEDULER_UNREACHABLE),
        ("rest_job_unknown.json", FailureKind.JOB_NOT_FOUND),
    ],
)
def test_job_payload_errors_are_classified(capture: str, kind: FailureKind) -> None:
    with pytest.raises(ReboundError) as caught:
        parse_jobs(load_payload(golden.read(capture), source=capture))
    assert caught.value.kind is kind


@pytest.mark.parametrize(
    ("capture", "kind"),
    [
        ("sinfo_ctld_down.json", FailureKind.SCHEDULER_UNREACHABLE),
        ("rest_ctld_down_nodes.json", FailureKind.SCHEDULER_UNREACHABLE),
        ("rest_node_unknown.json", FailureKind.NODE_NOT_FOUND),
    ],
)
def test_node_payload_errors_are_classified(capture: str, kind: FailureKind) -> None:
    with pytest.raises(ReboundError) as caught:
        parse_nodes(load_payload(golden.read(capture), source=capture))
    assert caught.value.kind is kind


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b'{"jobs": "x"}', b'{"errors": {}, "jobs": []}', b'{"errors": [1], "jobs": []}'],
)
def test_malformed_payloads_are_bad_responses(raw: bytes) -> None:
    with pytest.raises(ReboundError) as caught:
        parse_jobs(load_payload(raw, source="squeue"))
    assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ([1], "not an object"),
        ({"name": "x"}, "job_id"),
        ({"job_id": "7"}, "job_id"),
        ({"job_id": 7, "name": 5}, "'name'"),
        ({"job_id": 7, "nodes": "n[1-"}, "'nodes'"),
        ({"job_id": 7, "requeue": "yes"}, "'requeue'"),
        ({"job_id": 7, "restart_cnt": [1]}, "'restart_cnt'"),
    ],
)
def test_malformed_job_names_the_field(item: object, field: str) -> None:
    with pytest.raises(ReboundError, match=field) as caught:
        parse_job(item)
    assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE


def test_malformed_node() -> None:
    for item in ({"state": "idle"}, {"name": "n1", "partitions": [1]}, {"name": "n1", "cpus": "4"}):
        with pytest.raises(ReboundError) as caught:
            parse_node(item)
        assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE


def test_unknown_states_never_crash() -> None:
    assert parse_job({"job_id": 7, "job_state": "LAUNCH_FAILED_SOMEHOW"}).state is JobState.UNKNOWN
    assert parse_job({"job_id": 7}).state is JobState.UNKNOWN
    node = parse_node({"name": "n1", "state": "planned", "state_flags": ["POWERED_DOWN"]})
    assert (node.state, node.flags) == (NodeBaseState.UNKNOWN, ("PLANNED", "POWERED_DOWN"))


@pytest.mark.parametrize(
    ("value", "state"),
    [("RUNNING", JobState.RUNNING), ("node_fail", JobState.NODE_FAIL), (["PENDING", "REQUEUED"], JobState.PENDING)],
)
def test_job_state(value: object, state: JobState) -> None:
    assert job_state(value) is state


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("mixed", ["DRAIN"], (NodeBaseState.MIXED, ("DRAIN",))),
        (["IDLE", "DRAIN"], None, (NodeBaseState.IDLE, ("DRAIN",))),  # v0.0.39+
        ("MIXED+DRAIN", None, (NodeBaseState.MIXED, ("DRAIN",))),  # pyslurm
        ("DOWN*+DRAIN", None, (NodeBaseState.DOWN, ("NOT_RESPONDING", "DRAIN"))),
        (None, None, (NodeBaseState.UNKNOWN, ())),
    ],
)
def test_node_state(state: object, flags: object, expected: tuple[NodeBaseState, tuple[str, ...]]) -> None:
    assert node_state(state, flags) == expected


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        (0, (0, None)),
        (768, (3, None)),
        (9, (None, 9)),
        (137, (None, 9)),  # core-dump bit set
        ({"return_code": {"set": True, "number": 3}, "signal": {"id": {"set": False, "number": 0}}}, (3, None)),
        ({"return_code": 0, "signal": {"id": 15}}, (None, 15)),
        (None, (None, None)),
        ("3:0", (None, None)),
    ],
)
def test_decode_exit_status(raw: object, decoded: tuple[int | None, int | None]) -> None:
    assert decode_exit_status(raw) == decoded


def test_epoch_to_datetime() -> None:
    assert epoch_to_datetime(1796009256) == datetime(2026, 11, 30, 3, 27, 36, tzinfo=UTC)
    assert epoch_to_datetime(1796009256).tzinfo is UTC  # type: ignore[union-attr]  # not None, asserted above
    for unset in (None, 0, -5, 0xFFFFFFFE, 0xFFFFFFFF):
        assert epoch_to_datetime(unset) is None


def test_numbers_in_newer_shape() -> None:
    job = parse_job({"job_id": {"set": True, "infinite": False, "number": 7}, "restart_cnt": {"set": False}})
    assert (job.job_id, job.restart_count) == (7, 0)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("train-%j.out", "/w/train-42.out"),
        ("/abs/%x-%u-%N-%4j.log", "/abs/demo-alice-n1-0042.log"),
        ("%A_%a.out", "/w/40_2.out"),
        ("100%%-%s-%t.out", "/w/100%-%s-%t.out"),  # step patterns stay
        ("lit\\%j.out", "/w/lit%j.out"),  # a backslash disables expansion
        ("", ""),
    ],
)
def test_expand_output_path(pattern: str, expected: str) -> None:
    result = expand_output_path(
        pattern,
        job_id=42,
        name="demo",
        user="alice",
        batch_host="n1",
        array_job_id=40,
        array_task_id=2,
        working_directory="/w",
    )
    assert result == expected


def test_expand_output_path_leaves_unknown_values() -> None:
    assert expand_output_path("%N-%a.out", job_id=1, working_directory="/w") == "/w/%N-%a.out"


def test_array_tasks_and_default_output_of_the_lab_capture() -> None:
    """``squeue_array_het.json``: an array's tasks carry their own ids, and Slurm's default ``slurm-%A_%a.out``
    (not stored by Slurm: ``standard_output`` is empty) resolves to each task's own file in its working directory."""
    jobs = _jobs("squeue_array_het.json")
    task0, task1 = jobs[8], jobs[1]
    assert (task0.array_job_id, task0.array_task_id) == (1, 0)
    assert (task1.array_job_id, task1.array_task_id) == (1, 1)  # the master id is also the last task's own id
    assert task0.standard_output == task0.standard_error == "/lab/jobs/slurm-1_0.out"
    assert task1.standard_output == "/lab/jobs/slurm-1_1.out"
    plain = jobs[6]
    assert (plain.array_job_id, plain.array_task_id) == (None, None)  # Slurm says 0 and null
    assert plain.standard_output == "/lab/jobs/slurm-6.out"
    assert jobs[7].standard_output == "/lab/jobs/rel-namex-root-7.out"  # relative, %x and %u: written so on the lab


def test_heterogeneous_components_of_the_lab_capture() -> None:
    jobs = _jobs("squeue_array_het.json")
    for leader, other in ((2, 3), (4, 5)):
        assert (jobs[leader].het_job_id, jobs[leader].het_job_offset) == (leader, 0)
        assert (jobs[other].het_job_id, jobs[other].het_job_offset) == (leader, 1)
        assert jobs[leader].is_heterogeneous and jobs[other].is_heterogeneous
    assert not jobs[6].is_heterogeneous and jobs[6].het_job_offset is None


def test_per_node_sizes_of_jobs_and_nodes() -> None:
    job = _jobs()[1]  # --gres=gpu:2, one task per node
    assert (job.gpus_per_node, job.cpus_per_node) == (2, 1)
    assert _jobs()[5].excluded_nodes == ("n1",)  # squeue --json gives the exclusion as one hostlist string
    node = {n.name: n for n in parse_nodes(load_payload(golden.read("sinfo.json"), source="sinfo"))}["n1"]
    assert (node.gpus, node.cpus) == (4, 4)


@pytest.mark.parametrize(
    ("changes", "gpus", "cpus"),
    [
        ({"tres_per_node": "", "tres_per_job": "", "tres_per_task": ""}, 0, 1),  # asks for no GPU
        ({"tres_per_node": "", "tres_per_job": "gres:gpu:8"}, None, 1),  # --gpus=8: per node depends on layout
        ({"tres_per_node": "", "tres_per_task": "gres:gpu:1"}, None, 1),  # --gpus-per-task
        ({"tres_per_node": "gres/gpu:a100:4", "minimum_cpus_per_node": 32}, 4, 32),
        ({"cpus_per_tres": "gres:gpu:8"}, 2, 0),  # --cpus-per-gpu: not in the per-node minimum
        ({"tres_per_node": "gres:gpu:x:y"}, None, 1),  # unreadable: unknown, never 0
    ],
)
def test_job_sizes_from_tres(changes: dict[str, Any], gpus: int | None, cpus: int) -> None:
    item = next(j for j in golden.load("squeue.json")["jobs"] if j["job_id"] == 1)
    item.update(changes)
    job = parse_job(item)
    assert (job.gpus_per_node, job.cpus_per_node) == (gpus, cpus)


def test_node_gpus_from_gres() -> None:
    item = golden.load("sinfo.json")["nodes"][0]
    assert parse_node({**item, "gres": "gpu:a100:2(S:0,1),gpu:v100:2,shard:8"}).gpus == 4
    assert parse_node({**item, "gres": ""}).gpus == 0
    assert parse_node({k: v for k, v in item.items() if k != "gres"}).gpus is None
