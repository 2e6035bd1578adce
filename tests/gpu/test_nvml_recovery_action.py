"""The GPU recovery action through the real pynvml: nvmlDeviceGetFieldValues on the fake NVML, built against
NVIDIA's nvml.h, into ``GpuSample.recovery_action`` and the health verdict."""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from activities.gpu.activities import GpuActivities
from activities.gpu.nvml import NvmlSource
from activities.gpu.xid_catalog import default_xid_catalog
from deploy.local.fake_nvml_state import set_recovery_action
from tests.gpu.conftest import FakeNvml, wait_for
from workflows.domain.gpu import GpuAction, GpuHealthStatus, GpuRecoveryAction, NodeHealthCheckInput
from workflows.policy.gpu_event_rules import is_gpu_fault
from workflows.policy.gpu_health import gpu_health_verdict

A = GpuRecoveryAction


def test_a_healthy_gpu_reads_none_through_the_field_api(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    source.open()
    s = source.sample()[0]
    assert (s.recovery_action, s.recovery_action_code, s.unsupported, s.errors) == (A.NONE, 0, (), ())
    assert fake_nvml.count("nvmlDeviceGetFieldValues gpu=0 rc=0") == 1


@pytest.mark.parametrize(
    ("code", "action", "gpu_action"),
    [
        (1, A.GPU_RESET, GpuAction.RESET_GPU),
        (2, A.NODE_REBOOT, GpuAction.DRAIN_NODE),
        (3, A.DRAIN_P2P, GpuAction.RESET_GPU),
        (4, A.DRAIN_AND_RESET, GpuAction.RESET_GPU),
        (7, A.SYSTEM_REBOOT, GpuAction.DRAIN_NODE),
        (42, A.UNKNOWN, GpuAction.WATCH),  # a value newer than pynvml: named unknown, its number kept
    ],
)
def test_each_recovery_action_reaches_the_verdict(
    source: NvmlSource, fake_nvml: FakeNvml, code: int, action: GpuRecoveryAction, gpu_action: GpuAction
) -> None:
    set_recovery_action(fake_nvml.state, 2, code)
    source.open()
    samples = source.sample()
    assert [s.recovery_action for s in samples] == [A.NONE, A.NONE, action, A.NONE]
    assert samples[2].recovery_action_code == code
    verdict = gpu_health_verdict(fake_nvml.host, samples, catalog=default_xid_catalog(), source="nvml")
    assert verdict.action is gpu_action
    assert [g.index for g in verdict.gpus if g.findings] == [2]
    assert verdict.gpus[2].findings[0].rule == "recovery_action"
    if action is not A.UNKNOWN:
        assert verdict.status is GpuHealthStatus.FAILED


def test_a_driver_without_the_field_leaves_it_unread_not_none(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    # Before R570 the call succeeds and the field itself answers NOT_SUPPORTED (3); a failed call is an error.
    fake_nvml.append("gpu 1 recovery_action_rc 3", "gpu 2 fail nvmlDeviceGetFieldValues 999")
    source.open()
    s0, s1, s2, _ = source.sample()
    assert s0.recovery_action is A.NONE
    assert (s1.recovery_action, s1.unsupported, s1.errors) == (None, ("recovery_action", "recovery_action_code"), ())
    assert s2.recovery_action is None and s2.unsupported == ()
    assert [e.split(":")[0] for e in s2.errors] == ["recovery_action", "recovery_action_code"]
    verdict = gpu_health_verdict(fake_nvml.host, [s1, s2], catalog=default_xid_catalog())
    assert verdict.status is GpuHealthStatus.HEALTHY  # unread is not a fault either: no finding at all


@pytest.mark.parametrize(("code", "healthy"), [(0, True), (1, False), (2, False), (42, True)])
async def test_the_node_agents_health_check_holds_a_node_the_driver_wants_reset_or_rebooted(
    source: NvmlSource, fake_nvml: FakeNvml, code: int, healthy: bool
) -> None:
    # The quarantine's check before a drained node is returned: the driver's own recovery action fails it (an
    # unknown value is watched, not failed).
    set_recovery_action(fake_nvml.state, 3, code)
    result = await ActivityEnvironment().run(GpuActivities(source).health_check, NodeHealthCheckInput())
    assert result.healthy is healthy, result.detail
    if not healthy:
        assert "recovery_action=" in result.detail


@pytest.mark.parametrize(("code", "action", "fault"), [(0, A.NONE, False), (2, A.NODE_REBOOT, True)])
def test_an_xid_154_event_carries_the_action_it_changed_to(
    source: NvmlSource, fake_nvml: FakeNvml, code: int, action: GpuRecoveryAction, fault: bool
) -> None:
    # NVML's XID event says only "154": the action is read when the event arrives, so 154 back to none is no fault.
    source.open()
    fake_nvml.append(f"gpu 1 recovery_action {code}", "xid 1 154")
    wait_for(lambda: len(source.events_after(0).events) == 1, what="the XID 154 event")
    (event,) = source.events_after(0).events
    assert (event.xid, event.index, event.recovery_action) == (154, 1, action)
    assert is_gpu_fault(event, default_xid_catalog()) is fault


def test_other_xid_events_carry_no_recovery_action(source: NvmlSource, fake_nvml: FakeNvml) -> None:
    source.open()
    fake_nvml.append("gpu 0 recovery_action 1", "xid 0 79")
    wait_for(lambda: len(source.events_after(0).events) == 1, what="the XID 79 event")
    assert source.events_after(0).events[0].recovery_action is None
