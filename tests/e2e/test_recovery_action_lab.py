"""End to end on the lab: a node's driver asks for a reboot (NVML's recovery action field, then XID 154), the node's
own agent reads it through the real pynvml and the event it pushes is a node-level drain; back to none it is
evidence the agent keeps to itself. One node, no job: a few seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from activities.gpu.xid_catalog import default_xid_catalog
from deploy.local.fake_nvml_state import append_xid, set_recovery_action
from tests.lab_support import LabHandle, lab_rebound_settings
from workers.gpu_push import node_level_fault, worth_pushing
from workers.nodes_cli import read_node_gpus
from workflows.domain.gpu import GpuAction, GpuEvent, GpuRecoveryAction, GpuSample


@pytest.fixture
def node(lab: LabHandle) -> Iterator[str]:
    node = lab.nodes[-1]
    yield node
    lab.lab.rebound.reset_gpus(node)


async def _next_154(lab: LabHandle, node: str, cursor: int) -> tuple[GpuEvent, GpuSample, int]:
    settings = lab_rebound_settings(lab)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        res = await read_node_gpus(settings, node)
        assert res.report is not None, res.error
        new = [e for e in res.report.events if e.sequence > cursor and e.xid == 154]
        if new:
            return new[0], res.report.samples[1], res.report.next_event_cursor
        await asyncio.sleep(0.05)
    pytest.fail(f"no XID 154 from {node}'s agent within 10 s")


async def test_a_reboot_the_driver_asks_for_is_a_node_level_drain(lab: LabHandle, node: str) -> None:
    started = time.monotonic()
    first = await read_node_gpus(lab_rebound_settings(lab), node)
    assert first.report is not None and first.report.samples[1].recovery_action is GpuRecoveryAction.NONE
    state = lab.layout.nvml_state(node)

    set_recovery_action(state, 1, 2)  # what `rebound lab inject recovery-action --action node_reboot` writes
    append_xid(state, 1, 154)
    event, sample, cursor = await _next_154(lab, node, first.report.next_event_cursor)
    assert (event.index, event.recovery_action, sample.recovery_action) == (
        1,
        GpuRecoveryAction.NODE_REBOOT,
        GpuRecoveryAction.NODE_REBOOT,
    )
    fault = node_level_fault(event, node, default_xid_catalog())
    assert worth_pushing(event) and fault is not None and fault.action is GpuAction.DRAIN_NODE, fault

    set_recovery_action(state, 1, 0)  # the reboot's done: the driver says none again, with another XID 154
    append_xid(state, 1, 154)
    event, sample, _ = await _next_154(lab, node, cursor)
    assert (event.recovery_action, sample.recovery_action) == (GpuRecoveryAction.NONE, GpuRecoveryAction.NONE)
    assert not worth_pushing(event)
    print(f"recovery action through {node}'s agent: {time.monotonic() - started:.1f} s")
