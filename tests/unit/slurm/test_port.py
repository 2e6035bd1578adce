"""CompositeScheduler routes reads and actions to their own adapters."""

from __future__ import annotations

from activities.slurm.port import CompositeScheduler, SchedulerActions, SchedulerPort, SchedulerReads
from tests.fakes.scheduler import FakeScheduler


async def test_every_method_goes_to_its_side() -> None:
    reads, actions = FakeScheduler(), FakeScheduler()
    job = actions.submit(2)
    reads.submit(2)
    port = CompositeScheduler(reads=reads, actions=actions)
    assert isinstance(port, SchedulerPort)
    assert isinstance(port, SchedulerReads) and isinstance(port, SchedulerActions)

    await port.snapshot()
    await port.list_jobs()
    await port.get_job(job.job_id)
    await port.list_nodes()
    await port.get_node("n1")
    await port.ping()
    await port.drain_node("n3", "rebound: test")
    await port.resume_node("n3", expected_reason="rebound: test")
    await port.requeue_job(job.job_id, hold=True, expected_restart_count=0)
    await port.set_excluded_nodes(job.job_id, ["n2"])
    await port.release_job(job.job_id, start_now=True)

    assert [c.method for c in reads.calls] == ["snapshot", "list_jobs", "get_job", "list_nodes", "get_node", "ping"]
    assert [c.method for c in actions.calls] == [
        "drain_node",
        "resume_node",
        "requeue_job",
        "set_excluded_nodes",
        "release_job",
    ]
    assert actions.calls[2].kwargs == {"hold": True, "expected_restart_count": 0}


def test_public_names_are_curated() -> None:
    import importlib

    for name in ("cli", "errors", "guarded", "hostlist", "parse", "port", "pyslurm_adapter", "rest", "submission"):
        module = importlib.import_module(f"activities.slurm.{name}")
        exported = list(module.__all__)
        assert exported == sorted(exported), name
        assert all(hasattr(module, attr) for attr in exported), name
