"""One XID reported by NVML and by the driver's kernel line counts once, judged by the copy that carries the
driver's label (``workflows/policy/xid_copies.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.gpu.xid_catalog import default_xid_catalog
from workflows.domain.gpu import GpuAction, GpuEvent, GpuEventKind, GpuHealthStatus
from workflows.policy.gpu_health import gpu_health_verdict
from workflows.policy.xid_copies import (
    COPY_WINDOW,
    awaits_line,
    copies_of_one_fault,
    one_copy_per_fault,
    told_better,
)

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _nvml(xid: int, index: int = 0, at: datetime = T0, host: str = "n1") -> GpuEvent:
    return GpuEvent(kind=GpuEventKind.XID, host=host, index=index, xid=xid, source="nvml", observed_at=at)


def _line(xid: int, fatal: bool | None, index: int = 0, at: datetime = T0) -> GpuEvent:
    return GpuEvent(
        kind=GpuEventKind.XID, host="n1", index=index, xid=xid, source="kernel log", observed_at=at, fatal=fatal
    )


def test_nvml_and_the_kernel_line_of_one_xid_are_copies() -> None:
    assert copies_of_one_fault(_nvml(149), _line(149, False, at=T0 + timedelta(seconds=1)))
    assert not copies_of_one_fault(_nvml(149), _line(149, False, index=1))  # another GPU
    assert not copies_of_one_fault(_nvml(149), _line(148, False))  # another XID
    assert not copies_of_one_fault(_nvml(149), _line(149, False, at=T0 + COPY_WINDOW + timedelta(seconds=1)))
    assert not copies_of_one_fault(_nvml(149), _nvml(149))  # two NVML events are two faults (a repeat)
    assert not copies_of_one_fault(_nvml(149, host="n2"), _line(149, False))


def test_the_labelled_copy_stands_for_the_fault_in_either_order() -> None:
    nvml, line = _nvml(149), _line(149, False, at=T0 + timedelta(milliseconds=300))
    assert one_copy_per_fault([nvml, line]) == (line,)
    assert one_copy_per_fault([line, nvml]) == (line,)
    unlabelled = _line(79, None)
    assert one_copy_per_fault([_nvml(79), unlabelled]) == (_nvml(79),)  # saying as much: the first one stays
    other_gpu = _nvml(149, index=3)
    assert one_copy_per_fault([nvml, other_gpu, line]) == (other_gpu, line)
    assert told_better(nvml, [line]) and not told_better(line, [nvml])


def test_a_nonfatal_nvlink_xid_read_by_nvml_and_labelled_by_its_line_is_no_fault() -> None:
    catalog = default_xid_catalog()
    alone = gpu_health_verdict("n1", (), catalog=catalog, events=[_nvml(149)])
    assert alone.status is GpuHealthStatus.FAILED  # the catalogue's row: fatal, without the line's word
    both = gpu_health_verdict("n1", (), catalog=catalog, events=[_nvml(149), _line(149, False)])
    assert both.status is GpuHealthStatus.HEALTHY and both.action is GpuAction.NONE
    fatal = gpu_health_verdict("n1", (), catalog=catalog, events=[_nvml(149), _line(149, True)])
    assert fatal.status is GpuHealthStatus.FAILED
    assert len([f for v in fatal.gpus for f in v.findings]) == 1  # one fault, not two copies of it


def test_only_an_unlabelled_nvlink5_xid_from_nvml_waits_for_its_line() -> None:
    assert awaits_line(_nvml(149), kernel_log_followed=True)
    assert not awaits_line(_nvml(149), kernel_log_followed=False)  # no line will come: the catalogue decides now
    assert not awaits_line(_nvml(79), kernel_log_followed=True)  # its number decides
    assert not awaits_line(_line(149, None), kernel_log_followed=True)
