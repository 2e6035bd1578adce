"""End to end: each node agent reads its own node's fake NVML through the real pynvml, via Temporal."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from deploy.local.fake_nvml_state import append_xid, mark_gpu_lost
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.nodes_cli import read_node_gpus
from workflows.domain.gpu import GpuEventKind


@pytest.fixture
def healthy_gpus(lab: LabHandle) -> Iterator[LabHandle]:
    yield lab
    for node in lab.nodes:
        lab.lab.rebound.reset_gpus(node)


async def test_every_agent_reads_its_own_gpus(lab: LabHandle) -> None:
    settings = lab_rebound_settings(lab)
    uuids: set[str] = set()
    for node in lab.nodes:
        res = await read_node_gpus(settings, node)
        assert res.agent_reachable and res.report is not None, res.error
        assert res.report.error == ""
        assert res.report.host == node
        assert [s.index for s in res.report.samples] == [0, 1, 2, 3]
        uuids |= {s.uuid for s in res.report.samples}
    assert len(uuids) == 4 * len(lab.nodes), "GPU UUIDs must differ across nodes"


async def test_xid_and_lost_gpu_reach_the_workflow(healthy_gpus: LabHandle) -> None:
    lab = healthy_gpus
    settings = lab_rebound_settings(lab)
    state = lab.layout.nvml_state("n3")
    before = await read_node_gpus(settings, "n3")
    assert before.report is not None
    cursor = before.report.next_event_cursor

    append_xid(state, 2, 79)
    mark_gpu_lost(state, 2)
    deadline = time.monotonic() + 10
    kinds: list[tuple[GpuEventKind, int | None, int | None]] = []
    lost = False
    while time.monotonic() < deadline and not (lost and len(kinds) >= 2):
        res = await read_node_gpus(settings, "n3")
        assert res.report is not None
        kinds += [(e.kind, e.index, e.xid) for e in res.report.events if e.sequence > cursor]
        cursor = max(cursor, res.report.next_event_cursor)
        lost = any(s.lost for s in res.report.samples if s.index == 2)
    assert kinds[0] == (GpuEventKind.XID, 2, 79)
    assert (GpuEventKind.GPU_LOST, 2, None) in kinds
    assert lost


async def test_a_node_without_agent_is_reported_unreachable(lab: LabHandle) -> None:
    res = await read_node_gpus(lab_rebound_settings(lab), "n99")
    assert not res.agent_reachable
    assert "did not answer" in res.error
