"""Which kernel-log reader a node agent builds from its settings, and where it keeps its position."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities.kernel.readers import FileKernelLog, KmsgReader, PositionStore
from deploy.local.fake_gpus import StateFileGpuSource
from deploy.local.fake_nvml_state import write_initial_state
from workers.node_agent import kernel_log_follower
from workers.settings import Settings
from workflows.domain.node_events import KernelLogPosition


def _source(tmp_path: Path) -> StateFileGpuSource:
    write_initial_state(tmp_path / "n1.state", "n1", 2)
    return StateFileGpuSource("n1", tmp_path / "n1.state")


def _settings(tmp_path: Path, kernel_log: str) -> Settings:
    return Settings.model_validate({"state_dir": tmp_path, "node_agent": {"kernel_log": kernel_log}})


def test_empty_setting_reads_no_kernel_log(tmp_path: Path) -> None:
    assert kernel_log_follower(_settings(tmp_path, ""), _source(tmp_path)) is None


def test_a_file_per_node_resumes_from_the_saved_position(tmp_path: Path) -> None:
    log = tmp_path / "kernel" / "n1.log"
    log.parent.mkdir()
    log.write_text("old line\n")
    st = log.stat()
    PositionStore(tmp_path / "kernel-log" / "n1.position.json").save(
        KernelLogPosition(source=str(log), boot=f"{st.st_dev}:{st.st_ino}", seq=1)
    )
    follower = kernel_log_follower(_settings(tmp_path, str(tmp_path / "kernel" / "{node}.log")), _source(tmp_path))
    assert follower is not None
    reader = follower._reader  # noqa: SLF001 (the choice is what is tested)
    assert isinstance(reader, FileKernelLog) and reader.path == log
    assert reader.read().records == ()  # the saved position is honoured


@pytest.mark.skipif(not os.path.exists("/dev/kmsg"), reason="no /dev/kmsg on this host")  # noqa: PTH110
def test_a_character_device_is_read_as_kmsg(tmp_path: Path) -> None:
    follower = kernel_log_follower(_settings(tmp_path, "/dev/kmsg"), _source(tmp_path))
    assert follower is not None and isinstance(follower._reader, KmsgReader)  # noqa: SLF001
