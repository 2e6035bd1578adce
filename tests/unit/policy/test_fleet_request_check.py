"""The Fleet believes only what the scheduler confirms of a request (``workflows.policy.fleet.request_check``)."""

from __future__ import annotations

from tests.unit.policy.test_fleet import T0, cluster, node, request
from workflows.domain.fleet import FleetMode, FleetPolicy, FleetState
from workflows.domain.fleet_view import FleetView, FleetViewInput
from workflows.domain.slurm import ClusterSnapshot, JobState, NodeBaseState, SlurmJob, SlurmNode
from workflows.policy.fleet import allocation_partial, build_fleet_view, checked_request, decide_isolation


def snapshot_with(
    job_id: int, user: str, nodes: tuple[str, ...], *, extra: tuple[SlurmNode, ...] = ()
) -> ClusterSnapshot:
    job = SlurmJob(job_id=job_id, name="train", user=user, state=JobState.FAILED, nodes=nodes, partition="gpu")
    return cluster(4, extra=extra).model_copy(update={"jobs": (job,)})


def view_for(snap: ClusterSnapshot, job_id: int, *names: str) -> FleetView:
    return build_fleet_view(snap, FleetViewInput(nodes=names, partition="gpu", job_id=job_id))


def test_a_request_for_the_jobs_own_nodes_passes_unchanged() -> None:
    req = request("n1", job=7, user="alice")
    checked, notes = checked_request(req, view_for(snapshot_with(7, "alice", ("n1", "n2")), 7, "n1"))
    assert (checked, notes) == (req, ())


def test_nodes_outside_the_allocation_are_dropped_and_the_owner_is_the_schedulers() -> None:
    forged = request("n3", "n1", job=7, user="mallory")
    snap = snapshot_with(7, "alice", ("n1", "n2"))
    checked, notes = checked_request(forged, view_for(snap, 7, "n3", "n1"))
    assert checked.nodes == ("n1",) and checked.user == "alice"
    assert any("n3 not in job 7's allocation" in n for n in notes)
    assert any("'mallory'" in n and "alice" in n for n in notes)
    # What is then decided drains nothing that is not the job's.
    state = FleetState(cluster="c", mode=FleetMode.ACT)
    verdict = decide_isolation(state, checked, FleetPolicy(), view_for(snap, 7, "n3", "n1"), T0)
    assert "n3" not in verdict.drain and "n3" not in verdict.exclude


def test_a_job_the_scheduler_does_not_list_implicates_nothing_and_has_no_known_owner() -> None:
    req = request("n1", job=9, user="alice")
    checked, notes = checked_request(req, view_for(cluster(4), 9, "n1"))
    assert checked.nodes == () and checked.user == ""
    assert any("does not list job 9" in n for n in notes)


def test_a_failing_node_is_its_own_evidence_when_slurm_requeued_the_job_without_nodes() -> None:
    dead = SlurmNode(name="n2", state=NodeBaseState.DOWN, flags=("NOT_RESPONDING",), partitions=("gpu",))
    snap = snapshot_with(7, "alice", (), extra=(dead,))  # requeued: pending, no nodes
    checked, notes = checked_request(request("n2", job=7, user="alice"), view_for(snap, 7, "n2"))
    assert checked.nodes == ("n2",) and notes == ()
    healthy = node("n3")
    snap = snapshot_with(7, "alice", (), extra=(dead, healthy))
    checked, _ = checked_request(request("n2", "n3", job=7, user="alice"), view_for(snap, 7, "n2", "n3"))
    assert checked.nodes == ("n2",)


def test_a_view_without_the_job_leaves_the_request_as_it_came() -> None:
    req = request("n1", job=7)
    view = build_fleet_view(cluster(4), FleetViewInput(nodes=("n1",), partition="gpu"))
    assert checked_request(req, view) == (req, ())


def test_a_completing_job_lists_only_its_completing_nodes_so_the_fleet_waits() -> None:
    """Slurm lists a COMPLETING job on the nodes still completing: n1 finished first and drops out of the listing
    (lab, run 3 of test_job_output_claims: "Resending TERMINATE_JOB ... Nodelist=n2")."""
    job = SlurmJob(job_id=7, name="t", user="alice", state=JobState.COMPLETING, nodes=("n2",), partition="gpu")
    snap = cluster(4).model_copy(update={"jobs": (job,)})
    view = view_for(snap, 7, "n1")
    assert view.job is not None and view.job.completing
    assert allocation_partial(view, request("n1", job=7, user="alice"))
    assert not allocation_partial(view, request("n2", job=7, user="alice"))
    ended = snapshot_with(7, "alice", ("n1", "n2"))  # FAILED: the whole allocation again
    assert not allocation_partial(view_for(ended, 7, "n1"), request("n1", job=7, user="alice"))


def test_a_completing_job_whose_allocation_the_scheduler_gives_needs_no_wait() -> None:
    """The lab's chaos run: n4 (the failing node) finished completing first; for 30 s the listing named n3 only,
    and the Fleet dropped n4 from the request as "not the job's". squeue's job_resources still names both."""
    job = SlurmJob(
        job_id=3, name="t", user="alice", state=JobState.COMPLETING, nodes=("n3",), allocated_nodes=("n3", "n4")
    )
    snap = cluster(4).model_copy(update={"jobs": (job,)})
    view = view_for(snap, 3, "n4")
    assert view.job is not None and view.job.nodes == ("n3", "n4") and not view.job.completing
    req = request("n4", job=3, user="alice")
    assert not allocation_partial(view, req)
    assert checked_request(req, view) == (req, ())
