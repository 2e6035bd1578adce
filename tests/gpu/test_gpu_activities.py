"""The node agent's ``nvml_read_gpu_health`` activity, run with Temporal's ActivityEnvironment."""

from __future__ import annotations

import threading

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.gpu.activities import GpuActivities, NvmlReadGpuHealthInput
from activities.gpu.nvml import NvmlSource
from activities.gpu.port import EventBatch, GpuSource
from deploy.local.fake_nvml import fake_gpu_uuid
from tests.gpu.conftest import HOST, FakeNvml, wait_for
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuHealthReport, GpuSample


@pytest.fixture
def activities(source: NvmlSource) -> GpuActivities:
    return GpuActivities(source)


async def _read(acts: GpuActivities, cursor: int = 0) -> GpuHealthReport:
    return await ActivityEnvironment().run(acts.read_gpu_health, NvmlReadGpuHealthInput(event_cursor=cursor))


def test_registered_under_the_convention_name() -> None:
    # Workflows call it by this string on the node's task queue; temporalio has no public getter for it.
    assert activity._Definition.must_from_callable(GpuActivities.read_gpu_health).name == "nvml_read_gpu_health"


async def test_report_carries_samples_and_new_events_once(
    activities: GpuActivities, source: NvmlSource, fake_nvml: FakeNvml
) -> None:
    first = await _read(activities)
    assert (first.host, first.driver_version, first.error) == (HOST, "550.54.15", "")
    assert [s.uuid for s in first.samples] == [fake_gpu_uuid(HOST, i) for i in range(4)]
    assert first.events == ()

    fake_nvml.append("xid 1 48")
    wait_for(lambda: len(source.events_after(first.next_event_cursor).events) == 1, what="the XID")
    second = await _read(activities, first.next_event_cursor)
    assert [(e.kind, e.index, e.xid) for e in second.events] == [(GpuEventKind.XID, 1, 48)]
    third = await _read(activities, second.next_event_cursor)
    assert third.events == () and third.events_missed == 0
    # What crosses the Temporal boundary survives pydantic's JSON round trip unchanged.
    assert GpuHealthReport.model_validate_json(second.model_dump_json()) == second


async def test_no_driver_is_a_report_with_error_not_a_failure(activities: GpuActivities, fake_nvml: FakeNvml) -> None:
    fake_nvml.append("init_error 9")
    report = await _read(activities)
    assert report.error.startswith("GPU_SOURCE_UNAVAILABLE: NVML init failed: Driver Not Loaded")
    assert (report.samples, report.driver_version) == ((), "")
    fake_nvml.reset()  # the driver appears: the next read opens NVML by itself
    recovered = await _read(activities, report.next_event_cursor)
    assert recovered.error == "" and len(recovered.samples) == 4


class _StubSource:
    """A GpuSource that records where it runs and can fail its open with any kind."""

    def __init__(self, open_error: ReboundError | None = None) -> None:
        self.open_error = open_error
        self.sample_threads: list[threading.Thread] = []

    @property
    def host(self) -> str:
        return "stub"

    def open(self) -> None:
        if self.open_error is not None:
            raise self.open_error

    def driver_version(self) -> str:
        return "1.0"

    def sample(self) -> list[GpuSample]:
        self.sample_threads.append(threading.current_thread())
        return [GpuSample(host="stub", index=0)]

    def events_after(self, cursor: int) -> EventBatch:
        return EventBatch(events=(), next_cursor=cursor)

    def add_event(self, event: GpuEvent) -> GpuEvent:
        return event

    def close(self) -> None:
        return None


async def test_blocking_reads_run_off_the_event_loop() -> None:
    stub = _StubSource()
    port: GpuSource = stub  # the activity needs nothing beyond the port
    report = await _read(GpuActivities(port), cursor=7)
    assert (report.host, report.next_event_cursor, len(report.samples)) == ("stub", 7, 1)
    assert stub.sample_threads and stub.sample_threads[0] is not threading.current_thread()


async def test_a_source_that_cannot_work_here_fails_non_retryably() -> None:
    stub = _StubSource(ReboundError(FailureKind.CONFIGURATION, "nvidia-ml-py is not installed"))
    with pytest.raises(ApplicationError) as caught:
        await _read(GpuActivities(stub))
    assert (caught.value.type, caught.value.non_retryable) == ("CONFIGURATION", True)
