"""pyslurm adapter: the "not available" path, the mappings, and the call sequence against a stand-in module.

pyslurm itself cannot be installed here (it needs Slurm 25.11); these tests check Rebound's side only. The
stand-in objects carry pyslurm's attribute names, not its behaviour: see the adapter's fidelity note.
"""

from __future__ import annotations

import sys
import types
from datetime import UTC, datetime
from typing import Any

import pytest

from activities.slurm.port import SchedulerPort
from activities.slurm.pyslurm_adapter import PyslurmScheduler, job_from_pyslurm, load_pyslurm, node_from_pyslurm
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState, NodeBaseState

_T0 = 1796009256


def _job(**overrides: Any) -> types.SimpleNamespace:
    fields: dict[str, Any] = dict(
        id=7, name="train", user_name="alice", partition="main", state="RUNNING", state_reason="None",
        allocated_nodes="n[1-2]", batch_host="n1", is_batch_job=True, requeue_count=1, is_requeueable=True,
        excluded_nodes="n3", required_nodes=None, num_nodes=2, ntasks=8, exit_code=0, exit_code_signal=0,
        comment="rebound:watch", standard_output="/runs/train-7.out", standard_error="/runs/train-7.err",
        working_directory="/runs", submit_time=_T0 - 10, eligible_time=_T0 - 5, start_time=_T0, end_time=None,
        gres_per_node={"gpu": 4},
    )  # fmt: skip
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def _node(**overrides: Any) -> types.SimpleNamespace:
    fields: dict[str, Any] = dict(
        name="n2", state="MIXED+DRAIN", reason="rebound: xid 79", reason_user="root", reason_time=_T0,
        partitions=["main"], configured_gres={"gpu": 4}, alloc_gres={"gpu": 2}, total_cpus=4, alloc_cpus=1,
    )  # fmt: skip
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def test_missing_pyslurm_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes the import fail, installed or not
    with pytest.raises(ReboundError, match="needs Slurm 25.11") as caught:
        PyslurmScheduler()
    assert caught.value.kind is FailureKind.CONFIGURATION


def test_wrong_pyslurm_release_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    old = types.ModuleType("pyslurm")
    old.__version__ = "22.5.1"  # type: ignore[attr-defined]  # a stand-in module
    monkeypatch.setitem(sys.modules, "pyslurm", old)
    with pytest.raises(ReboundError, match="22.5.1") as caught:
        load_pyslurm()
    assert caught.value.kind is FailureKind.CONFIGURATION


def test_job_mapping() -> None:
    job = job_from_pyslurm(_job())
    assert (job.job_id, job.state, job.nodes, job.excluded_nodes, job.restart_count) == (
        7,
        JobState.RUNNING,
        ("n1", "n2"),
        ("n3",),
        1,
    )
    assert job.tres_per_node == "gres:gpu:4"
    assert job.standard_error == "/runs/train-7.err"
    assert job.start_time == datetime.fromtimestamp(_T0, UTC)
    assert job.exit_code is None  # not terminal yet


def test_job_mapping_of_ended_jobs() -> None:
    failed = job_from_pyslurm(_job(state="FAILED", exit_code=3, end_time=_T0 + 60))
    assert (failed.exit_code, failed.exit_signal, failed.end_time) == (3, None, datetime.fromtimestamp(_T0 + 60, UTC))
    killed = job_from_pyslurm(_job(state="CANCELLED", exit_code=0, exit_code_signal=9))
    assert (killed.exit_code, killed.exit_signal) == (None, 9)
    dated = job_from_pyslurm(_job(start_time=datetime.fromtimestamp(_T0, UTC)))  # if 25.11 hands out datetimes
    assert dated.start_time == datetime.fromtimestamp(_T0, UTC)


def test_job_mapping_rejects_unusable_attributes() -> None:
    with pytest.raises(ReboundError) as caught:
        job_from_pyslurm(_job(id="seven"))
    assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE


def test_node_mapping() -> None:
    node = node_from_pyslurm(_node())
    assert (node.state, node.flags, node.reason, node.reason_set_by_user) == (
        NodeBaseState.MIXED,
        ("DRAIN",),
        "rebound: xid 79",
        "root",
    )
    assert (node.gres, node.gres_used, node.cpus, node.alloc_cpus) == ("gpu:4", "gpu:2", 4, 1)
    assert node.reason_changed_at == datetime.fromtimestamp(_T0, UTC)
    assert node_from_pyslurm(_node(state=["IDLE", "DRAIN"])).is_drained  # list form accepted too


class _RPCError(Exception):
    def __init__(self, errno: int, msg: str) -> None:
        super().__init__(msg)
        self.errno = errno


def _stand_in(jobs: list[types.SimpleNamespace], nodes: list[types.SimpleNamespace]) -> tuple[Any, list[str]]:
    """A module with pyslurm's entry points that records what the adapter asks of it."""
    calls: list[str] = []
    by_id = {j.id: j for j in jobs}

    class Job:
        def __init__(self, job_id: int) -> None:
            self.job_id = job_id

        @staticmethod
        def load(job_id: int) -> types.SimpleNamespace:
            if job_id not in by_id:
                raise _RPCError(2017, "Invalid job id specified")
            return by_id[job_id]

        def requeue(self, hold: bool = False) -> None:
            calls.append(f"requeue {self.job_id} hold={hold}")

        def hold(self, mode: str | None = None) -> None:
            calls.append(f"hold {self.job_id} {mode}")

        def release(self) -> None:
            calls.append(f"release {self.job_id}")

        def modify(self, changes: types.SimpleNamespace) -> None:
            calls.append(f"modify {self.job_id} {vars(changes)}")

    class Node:
        def __init__(self, name: str | None = None, **changes: Any) -> None:
            self.name, self.changes = name, changes

        def modify(self, changes: Node) -> None:
            calls.append(f"modify {self.name} {changes.changes}")

    module = types.ModuleType("pyslurm")
    module.__dict__.update(
        __version__="25.11.2",
        RPCError=_RPCError,
        Job=Job,
        Node=Node,
        JobSubmitDescription=types.SimpleNamespace,
        Jobs=types.SimpleNamespace(load=lambda: {j.id: j for j in jobs}),
        Nodes=types.SimpleNamespace(load=lambda: {n.name: n for n in nodes}),
    )
    return module, calls


async def test_adapter_calls_against_a_stand_in_module() -> None:
    module, calls = _stand_in([_job(), _job(id=8, state="PENDING", state_reason="JobHeldUser")], [_node()])
    scheduler = PyslurmScheduler(module)
    assert isinstance(scheduler, SchedulerPort)
    snapshot = await scheduler.snapshot()
    assert [j.job_id for j in snapshot.jobs] == [7, 8] and snapshot.node("n2") is not None
    assert await scheduler.get_job(9999) is None
    await scheduler.ping()
    await scheduler.drain_node("n2", "rebound: xid 79")  # already drained so: no call
    await scheduler.resume_node("n2")
    await scheduler.requeue_job(7, hold=True)
    await scheduler.set_excluded_nodes(8, ["n1"])
    await scheduler.release_job(8, start_now=True)
    assert calls == [
        "modify n2 {'state': 'RESUME'}",
        "requeue 7 hold=True",
        "modify 8 {'excluded_nodes': 'n1'}",
        "modify 8 {'begin_time': 'now'}",
        "release 8",
    ]


async def test_rpc_errors_are_classified_by_number() -> None:
    module, _ = _stand_in([_job()], [_node()])

    def refuse(self: Any, hold: bool = False) -> None:
        raise _RPCError(2037, "Requested operation is presently disabled")

    module.Job.requeue = refuse
    with pytest.raises(ReboundError) as caught:
        await PyslurmScheduler(module).requeue_job(7)
    assert caught.value.kind is FailureKind.SCHEDULER_REJECTED

    def down() -> None:
        raise _RPCError(1001, "Communication connection failure")

    module.Nodes = types.SimpleNamespace(load=down)
    with pytest.raises(ReboundError) as caught:
        await PyslurmScheduler(module).list_nodes()
    assert caught.value.kind is FailureKind.SCHEDULER_UNREACHABLE


async def test_other_pyslurm_exceptions_are_classified_too() -> None:
    module, _ = _stand_in([_job()], [_node()])

    def invalid(self: Any, hold: bool = False) -> None:
        raise ValueError("Invalid Node state: RESUME")

    module.Job.requeue = invalid
    with pytest.raises(ReboundError) as caught:
        await PyslurmScheduler(module).requeue_job(7)
    assert caught.value.kind is FailureKind.SCHEDULER_REJECTED
