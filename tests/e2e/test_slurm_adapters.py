"""The scheduler adapters against the real lab cluster (Slurm 22.05, 4 nodes): reads agree, actions verified.

Every action is verified by a *fresh* observation through the adapter (a new ``squeue``/``sinfo``), as the
architecture's recovery-action latency requires. The ``lab`` fixture (tests/e2e/conftest.py) cancels the
test's jobs and resumes drained nodes afterwards. Its ``wait_for`` takes a synchronous predicate, so the async
adapters are polled with ``_eventually`` instead, without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from pydantic import SecretStr

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.port import SchedulerReads
from activities.slurm.rest import SlurmRestScheduler, rest_client
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import JobState, SlurmJob

pytestmark = pytest.mark.lab

_T = TypeVar("_T")
_REASON = "rebound: e2e adapter test"


@pytest.fixture
def cli(lab: Any) -> SlurmCliScheduler:
    return SlurmCliScheduler(env=lab.slurm_env, timeout_s=15)


@pytest_asyncio.fixture
async def rest_uds(lab: Any) -> AsyncIterator[SlurmRestScheduler]:
    async with rest_client(unix_socket=lab.rest_socket, timeout_s=15) as client:
        yield SlurmRestScheduler(client)


@pytest_asyncio.fixture
async def rest_jwt(lab: Any) -> AsyncIterator[SlurmRestScheduler]:
    token = SecretStr(lab.jwt_token())
    async with rest_client(url=lab.rest_url, user="root", token=token, timeout_s=15) as client:
        yield SlurmRestScheduler(client)


async def _eventually(probe: Callable[[], Awaitable[_T | None]], timeout_s: float, what: str) -> _T:
    """Poll ``probe`` until it returns something truthy; ``ReboundError`` of a retryable kind counts as "not yet"."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = value
        except ReboundError as e:
            if not e.kind.retryable:
                raise
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
        await asyncio.sleep(0.1)


async def _running(port: SchedulerReads, job_id: int, timeout_s: float = 20) -> SlurmJob:
    async def probe() -> SlurmJob | None:
        job = await port.get_job(job_id)
        assert job is not None, f"job {job_id} vanished"
        assert not job.state.is_terminal(), f"job {job_id} ended: {job}"
        return job if job.state is JobState.RUNNING else None

    return await _eventually(probe, timeout_s, f"job {job_id} RUNNING")


async def test_cli_and_rest_read_the_same_cluster(
    lab: Any, cli: SlurmCliScheduler, rest_uds: SlurmRestScheduler, rest_jwt: SlurmRestScheduler
) -> None:
    job_id = lab.submit_sleep_job(nodes=2)
    job = await _running(cli, job_id)
    assert len(job.nodes) == 2 and job.batch_host == job.nodes[0] and job.requeue_allowed

    snapshots = [await port.snapshot() for port in (cli, rest_uds, rest_jwt)]
    for snapshot in snapshots:
        assert sorted(n.name for n in snapshot.nodes) == sorted(lab.nodes)
        assert snapshot.job(job_id) == snapshots[0].job(job_id)  # same parser, same running job
        assert {n.name: (n.state, n.is_drained) for n in snapshot.nodes} == {
            n.name: (n.state, n.is_drained) for n in snapshots[0].nodes
        }
    for port in (cli, rest_uds, rest_jwt):
        assert await port.get_job(99_999_999) is None
        assert await port.get_node("no-such-node") is None
        await port.ping()
        listed = {j.job_id for j in await port.list_jobs()}
        assert job_id in listed


async def test_drain_and_resume_are_idempotent_and_respect_ownership(
    lab: Any, cli: SlurmCliScheduler, rest_uds: SlurmRestScheduler
) -> None:
    node = lab.nodes[-1]
    await cli.drain_node(node, _REASON)
    drained = await cli.get_node(node)
    assert drained is not None and drained.is_drained and drained.reason == _REASON
    assert drained.reason_set_by_user  # callers can see who owns the drain
    seen_by_rest = await rest_uds.get_node(node)
    assert seen_by_rest is not None and seen_by_rest.reason == _REASON

    await asyncio.sleep(1.1)  # reason_changed_at has 1 s resolution: a second scontrol call would move it
    await cli.drain_node(node, _REASON)
    again = await cli.get_node(node)
    assert again is not None and again.reason_changed_at == drained.reason_changed_at

    with pytest.raises(ReboundError) as caught:
        await cli.drain_node(node, "rebound: someone else's idea")
    assert caught.value.kind is FailureKind.NOT_OWNED
    with pytest.raises(ReboundError) as caught:
        await cli.resume_node(node, expected_reason="ops: not this one")
    assert caught.value.kind is FailureKind.NOT_OWNED
    still = await cli.get_node(node)
    assert still is not None and still.reason == _REASON

    await cli.resume_node(node, expected_reason=_REASON)

    async def usable() -> bool:
        fresh = await cli.get_node(node)
        return fresh is not None and fresh.is_usable  # idle* (NOT_RESPONDING) for ~0.5 s after a resume

    await _eventually(usable, 10, f"{node} back in service")
    await cli.resume_node(node)  # nothing to resume: a no-op, not Slurm's "Invalid node state"


async def test_requeue_with_an_excluded_node_restarts_elsewhere(lab: Any, cli: SlurmCliScheduler) -> None:
    job_id = lab.submit_sleep_job(nodes=2)
    job = await _running(cli, job_id)
    bad = job.nodes[-1]

    await cli.requeue_job(job_id, expected_restart_count=job.restart_count)
    # Slurm holds a requeued job for cred_expire + 1 s, so the exclusion lands before it can start again.
    await cli.set_excluded_nodes(job_id, [bad])
    requeued = await cli.get_job(job_id)
    assert requeued is not None
    assert requeued.state in (JobState.COMPLETING, JobState.PENDING)
    assert requeued.restart_count == job.restart_count + 1
    assert bad in requeued.excluded_nodes

    await cli.requeue_job(job_id, expected_restart_count=job.restart_count)  # a retried activity: no-op
    restarted = await _running(cli, job_id, timeout_s=60)
    assert restarted.restart_count == job.restart_count + 1
    assert bad not in restarted.nodes and len(restarted.nodes) == 2
    assert bad in restarted.excluded_nodes


async def test_requeue_hold_exclude_release_is_fast(lab: Any, cli: SlurmCliScheduler) -> None:
    job_id = lab.submit_sleep_job(nodes=2)
    job = await _running(cli, job_id)
    # start_now is only safe off every node of the previous run (they revoke the job's credential for
    # cred_expire seconds): exclude the whole old allocation.
    old = list(job.nodes)
    started = time.monotonic()

    await cli.requeue_job(job_id, hold=True, expected_restart_count=job.restart_count)
    await cli.requeue_job(job_id, hold=True, expected_restart_count=job.restart_count)
    await cli.set_excluded_nodes(job_id, old)
    held = await cli.get_job(job_id)
    assert held is not None and held.state_reason == "JobHeldUser" and set(old) <= set(held.excluded_nodes)

    async def release() -> bool:
        await cli.release_job(job_id, start_now=True)  # SCHEDULER_BUSY while COMPLETING: retried
        return True

    await _eventually(release, 15, f"release of job {job_id}")
    restarted = await _running(cli, job_id, timeout_s=15)
    elapsed = time.monotonic() - started
    assert restarted.restart_count == job.restart_count + 1
    assert not set(old) & set(restarted.nodes)
    print(f"\nrequeue(hold) -> exclude -> release(start_now) -> RUNNING elsewhere: {elapsed:.2f} s")


async def test_refusals_are_classified(lab: Any, cli: SlurmCliScheduler) -> None:
    pinned = lab.submit_sleep_job(nodes=1, requeue=False)
    await _running(cli, pinned)
    cases: list[tuple[Callable[[], Awaitable[None]], FailureKind]] = [
        (lambda: cli.requeue_job(pinned), FailureKind.SCHEDULER_REJECTED),  # --no-requeue
        (lambda: cli.set_excluded_nodes(pinned, [lab.nodes[0]]), FailureKind.SCHEDULER_REJECTED),  # running
        (lambda: cli.requeue_job(99_999_999), FailureKind.JOB_NOT_FOUND),
        (lambda: cli.drain_node("no-such-node", _REASON), FailureKind.NODE_NOT_FOUND),
    ]
    for action, kind in cases:
        with pytest.raises(ReboundError) as caught:
            await action()
        assert caught.value.kind is kind
