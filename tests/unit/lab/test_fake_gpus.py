"""The Python reader of the fake NVML state file (many fake nodes in one agent process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.local.fake_gpus import StateFileGpuSource
from deploy.local.fake_nvml import fake_gpu_uuid
from deploy.local.fake_nvml_state import append_xid, mark_gpu_lost, write_initial_state
from deploy.local.node_agents import state_file
from workflows.domain.errors import ReboundError
from workflows.domain.gpu import GpuEventKind


def _source(tmp_path: Path, gpus: int = 4) -> tuple[StateFileGpuSource, Path]:
    path = state_file(tmp_path, "n7")
    write_initial_state(path, "n7", gpus)
    return StateFileGpuSource("n7", path), path


def test_healthy_node_samples_every_gpu(tmp_path: Path) -> None:
    source, _ = _source(tmp_path)
    source.open()
    samples = source.sample()
    assert [s.index for s in samples] == [0, 1, 2, 3]
    assert samples[2].uuid == fake_gpu_uuid("n7", 2)
    assert not any(s.lost for s in samples)
    assert source.events_after(0).events == ()


def test_appended_xid_is_one_event_served_by_cursor(tmp_path: Path) -> None:
    source, path = _source(tmp_path)
    source.open()
    cursor = source.events_after(0).next_cursor
    append_xid(path, 3, 79)
    batch = source.events_after(cursor)
    assert [(e.kind, e.index, e.xid, e.host) for e in batch.events] == [(GpuEventKind.XID, 3, 79, "n7")]
    assert source.events_after(batch.next_cursor).events == ()  # never twice
    assert source.sample()[3].last_xid == 79


def test_lost_gpu_is_reported_once_and_sampled_lost(tmp_path: Path) -> None:
    source, path = _source(tmp_path)
    source.open()
    mark_gpu_lost(path, 1)
    mark_gpu_lost(path, 1)
    kinds = [e.kind for e in source.events_after(0).events]
    assert kinds == [GpuEventKind.GPU_LOST]
    assert source.sample()[1].lost


def test_rewritten_state_is_a_healthy_node_again(tmp_path: Path) -> None:
    source, path = _source(tmp_path)
    source.open()
    mark_gpu_lost(path, 0)
    assert source.sample()[0].lost
    write_initial_state(path, "n7", 4)
    assert not source.sample()[0].lost


def test_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    source, path = _source(tmp_path)
    source.open()
    with path.open("a") as f:
        f.write("xid 2 ")
    assert source.events_after(0).events == ()
    with path.open("a") as f:
        f.write("48\n")
    assert [e.xid for e in source.events_after(0).events] == [48]


def test_missing_state_file_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    source = StateFileGpuSource("n9", tmp_path / "n9.state")
    with pytest.raises(ReboundError):
        source.open()
    assert source.events_after(0).events == ()
