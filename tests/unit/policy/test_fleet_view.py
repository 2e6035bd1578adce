"""The Fleet's view of the cluster: the nodes a decision names and counts for the rest, the same decisions as the
whole snapshot gave, and a payload far under Temporal's 2 MB limit at 10,000 jobs."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from workers.bench.synthetic_slurm import node_name, sinfo_document, squeue_document
from workflows.domain.fleet import FleetMode, FleetState, IsolationRequest, NodeLifecycle, NodeRecord
from workflows.domain.fleet_view import FleetViewInput
from workflows.domain.slurm import ClusterSnapshot, NodeBaseState, SlurmNode
from workflows.policy.fleet import build_fleet_view, view_input
from workflows.policy.fleet.suspicion import fit_exclusion

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TEMPORAL_PAYLOAD_LIMIT = 2 * 1024 * 1024


def _payload_bytes(value: object) -> int:
    return int(pydantic_data_converter.payload_converter.to_payloads([value])[0].ByteSize())


def _node(
    name: str, *, parts: tuple[str, ...] = ("gpu",), gpus: int | None = 8, cpus: int = 64, **kw: object
) -> SlurmNode:
    return SlurmNode.model_validate(
        {"name": name, "state": "idle", "partitions": parts, "gpus": gpus, "cpus": cpus, **kw}
    )


def test_the_view_shows_the_asked_nodes_and_counts_the_rest() -> None:
    nodes = (
        _node("a1"),
        _node("a2", gpus=4),
        _node("a3", flags=("DRAIN",)),
        _node("b1", parts=("debug",)),
        _node("b2", parts=("gpu", "debug"), state="down"),
    )
    view = build_fleet_view(
        ClusterSnapshot(observed_at=T0, nodes=nodes), FleetViewInput(nodes=("a3", "ghost"), partition="gpu")
    )
    assert view.node_count == 5
    assert view.partition_sizes == {"debug": 2, "gpu": 4}
    assert view.node("a3") == nodes[2]
    assert view.node("ghost") is None  # asked, and not in the cluster
    with pytest.raises(LookupError):
        view.node("a1")  # never asked: the view cannot say
    counts = {(p.gpus, p.cpus): p.count for p in view.placeable}
    assert counts == {(8, 64): 1, (4, 64): 1}  # a3 drained and b2 down are not placeable; b1 not in gpu
    whole = build_fleet_view(ClusterSnapshot(observed_at=T0, nodes=nodes), FleetViewInput(partition=""))
    assert sum(p.count for p in whole.placeable) == 3


def test_what_a_decision_asks_for() -> None:
    state = FleetState(cluster="c", nodes={"r1": NodeRecord(node="r1", since=T0, state=NodeLifecycle.DRAINED)})
    req = _request(("n1", "n2"), excluded_before=("x1",), owner_excluded=("o1",), partition="gpu,debug")
    # The request's job too: the Fleet checks its owner and allocation against the scheduler (request_check).
    assert view_input(state, req) == FleetViewInput(
        nodes=("r1", "n1", "n2", "x1", "o1"), partition="gpu,debug", job_id=req.job_id
    )
    assert view_input(state, nodes=("n9",)) == FleetViewInput(nodes=("r1", "n9"))


def _request(
    nodes: Sequence[str],
    *,
    node_count: int = 2,
    excluded_before: Sequence[str] = (),
    owner_excluded: Sequence[str] = (),
    partition: str = "gpu",
    gpus: int | None = None,
    cpus: int = 0,
) -> IsolationRequest:
    return IsolationRequest(
        request_id="rebound/c/job/1/incident-1",
        reply_to="rebound/c/job/1",
        job_id=1,
        partition=partition,
        incident="1-1",
        cause="rank-killed",
        nodes=tuple(nodes),
        requested_at=T0,
        node_count=node_count,
        excluded_before=tuple(excluded_before),
        owner_excluded=tuple(owner_excluded),
        gpus_per_node=gpus,
        cpus_per_node=cpus,
    )


def _scan_fit(
    snapshot: ClusterSnapshot, req: IsolationRequest, unavailable: Sequence[str], suspects: Sequence[str]
) -> int:
    """How many nodes the job could still use without the suspects, by scanning every node (the rule as it read
    the whole snapshot before the view)."""
    wanted = {p.strip() for p in req.partition.split(",") if p.strip()}
    out = set(unavailable) | set(req.excluded_before) | set(req.owner_excluded)
    placeable = (NodeBaseState.IDLE, NodeBaseState.MIXED, NodeBaseState.ALLOCATED)
    candidates = [
        n
        for n in snapshot.nodes
        if (not wanted or wanted.intersection(n.partitions))
        and n.state in placeable
        and not n.is_drained
        and n.is_responding
        and n.name not in out
    ]
    by_gpus = req.gpus_per_node is not None and all(n.gpus is not None for n in candidates)
    by_cpus = req.cpus_per_node > 0 and all(n.cpus > 0 for n in candidates)

    def fits(n: SlurmNode) -> bool:
        return (not by_gpus or (n.gpus or 0) >= (req.gpus_per_node or 0)) and (
            not by_cpus or n.cpus >= req.cpus_per_node
        )

    return len([n for n in candidates if fits(n) and n.name not in set(suspects)])


def test_the_placement_check_on_the_view_counts_what_a_scan_of_the_whole_cluster_counts() -> None:
    rng = random.Random(12)
    pick: Callable[[Sequence[str]], str] = rng.choice
    for _ in range(400):
        names = [f"n{i}" for i in range(rng.randint(1, 14))]
        nodes = tuple(
            _node(
                name,
                parts=tuple(rng.sample(["gpu", "debug", "big"], rng.randint(1, 2))),
                gpus=rng.choice([None, 0, 4, 8]),
                cpus=rng.choice([0, 16, 64]),
                state=rng.choice(["idle", "mixed", "allocated", "down"]),
                flags=rng.choice([(), ("DRAIN",), ("NOT_RESPONDING",)]),
            )
            for name in names
        )
        snapshot = ClusterSnapshot(observed_at=T0, nodes=nodes)
        pool = [*names, "ghost"]
        suspects = sorted({pick(pool) for _ in range(rng.randint(1, 3))})
        unavailable = sorted({pick(pool) for _ in range(rng.randint(0, 2))})
        req = _request(
            sorted({*suspects, *unavailable}),  # both come from the request's nodes
            node_count=rng.randint(1, 6),
            excluded_before=sorted({pick(pool) for _ in range(rng.randint(0, 2))}),
            owner_excluded=sorted({pick(pool) for _ in range(rng.randint(0, 1))}),
            partition=rng.choice(["gpu", "debug", "gpu,big", ""]),
            gpus=rng.choice([None, 0, 4, 8]),
            cpus=rng.choice([0, 16, 64]),
        )
        view = build_fleet_view(snapshot, view_input(FleetState(cluster="c", mode=FleetMode.ACT), req))
        kept, reasons = fit_exclusion(view, req, unavailable, suspects)
        left = _scan_fit(snapshot, req, unavailable, suspects)
        assert (kept == list(suspects)) == (left >= req.node_count), (req, unavailable, reasons)
        if not kept:
            assert f"would keep {left} placeable" in reasons[0]


def test_a_fleet_view_at_ten_thousand_jobs_stays_far_under_temporals_payload_limit() -> None:
    """The whole snapshot at 10,000 jobs is several MB (over the limit); the view of one decision a few KB."""
    jobs = parse_jobs(load_payload(squeue_document(10_000), source="squeue --json"))
    nodes = parse_nodes(load_payload(sinfo_document(9_000), source="sinfo --json"))
    snapshot = ClusterSnapshot(observed_at=T0, jobs=jobs, nodes=nodes)
    recorded = {
        node_name(i): NodeRecord(node=node_name(i), since=T0, state=NodeLifecycle.HEALTHY) for i in range(0, 9_000, 45)
    }  # 200 nodes the Fleet dealt with before
    state = FleetState(cluster="c", mode=FleetMode.ACT, nodes=recorded)
    req = _request([node_name(i) for i in range(8)], excluded_before=[node_name(20)], gpus=8, cpus=64, node_count=8)
    view = build_fleet_view(snapshot, view_input(state, req))
    assert len(view.nodes) == 208  # n00001 is both recorded and asked
    assert _payload_bytes(snapshot) > TEMPORAL_PAYLOAD_LIMIT
    assert _payload_bytes(view) < 200_000
    assert fit_exclusion(view, req, (), (node_name(1),))[0] == [node_name(1)]
