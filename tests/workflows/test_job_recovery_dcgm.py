"""A JobRecovery whose crashed rank's node has a DCGM exporter showing a failed GPU (served over real HTTP): the
crash is that GPU's fault, with DCGM named (``workflows.policy.attribution_gpu``), instead of a rank crash."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.gpu.dcgm_activities import DcgmTargets
from tests.gpu.exporter import Exporter, page, running_exporter
from tests.workflows.test_job_recovery import Harness, until
from workflows.domain.incident import ActionRung, EvidenceKind, FailureClass
from workflows.domain.recovery import RecoveryState


@pytest_asyncio.fixture
async def h(temporal_client: Client, task_queue: str, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(temporal_client, task_queue, tmp_path)
    async with harness.worker():
        yield harness


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    with running_exporter() as running:
        yield running


def _crash(h: Harness, job_id: int) -> None:
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    h.step(job_id, 0, 7, h.nodes[0])
    h.log(job_id, 2, f"{ts} [ERROR] rank=2/4 node={h.nodes[1]} step=8 fatal error: exiting with code 13")
    h.sched.fail_job(job_id, exit_code=13)


async def test_a_crash_on_a_node_whose_dcgm_page_fails_a_gpu_is_that_gpus_fault(h: Harness, exporter: Exporter) -> None:
    bad = h.nodes[1]
    exporter.state.pages[f"/{bad}/metrics"] = page("h100-8gpu-faults.prom").encode()  # GPU 5: 2 volatile DBEs
    h.dcgm = DcgmTargets(exporter.url.replace("/metrics", "/{node}/metrics"), (bad,))
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    _crash(h, job.job_id)

    st = await until(handle, lambda s: s.incidents and s.incidents[0].attribution is not None, timeout=30)
    att = st.incidents[0].attribution
    assert att is not None
    assert (att.failure_class, att.cause, att.implicated_nodes) == (FailureClass.HARDWARE, "ecc-dbe-volatile", (bad,))
    assert att.implicated_gpus == (f"{bad}:5",)
    assert (att.basis, att.action) == (EvidenceKind.GPU_DCGM, ActionRung.DRAIN)
    assert any("dcgm: ecc_uncorrected_volatile=2" in e.text for e in att.evidence), att.evidence
    verdicts = [e.detail for e in st.timeline if e.event == "GPU_VERDICT"]
    assert len(verdicts) == 1 and verdicts[0].startswith(f"{bad} dcgm: failed: "), verdicts
    assert exporter.state.paths == [f"/{bad}/metrics"]  # only the node with an exporter was read
    await handle.terminate()


async def test_an_exporter_that_is_down_is_said_and_blames_nobody(h: Harness, exporter: Exporter) -> None:
    bad = h.nodes[1]
    exporter.serve("upstream gone", status=503)
    h.dcgm = DcgmTargets(exporter.url.replace("/metrics", "/{node}/metrics"), (bad,))
    job = h.sched.submit(h.nodes[:2], name="llm")
    handle = await h.start(job.job_id)
    await until(handle, lambda s: s.state is RecoveryState.WATCHING)
    _crash(h, job.job_id)

    st = await until(handle, lambda s: s.incidents and s.incidents[0].attribution is not None, timeout=30)
    att = st.incidents[0].attribution
    assert att is not None and att.cause == "rank-crash" and att.action is ActionRung.EXCLUDE, att
    verdicts = [e.detail for e in st.timeline if e.event == "GPU_VERDICT"]
    assert len(verdicts) == 1 and "HTTP 503" in verdicts[0] and f"{bad} dcgm: degraded" in verdicts[0], verdicts
    await handle.terminate()
