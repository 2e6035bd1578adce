"""The scan as a whole: the demo's layout, plain torch.save files, several formats at once, unreadable
directories, and the promise that nothing pickled is ever run."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest

from activities.checkpoints.files import torch_save_fields
from activities.checkpoints.inert_pickle import Inert, UnreadablePickle, load_inert
from activities.checkpoints.scan import scan_checkpoints
from deploy.demo.checkpoint import write_checkpoint
from tests.unit.checkpoints.conftest import Torch, truncate
from workflows.domain.checkpoints import CheckpointFormat, CheckpointStatus


def test_demo_layout_written_by_the_demo(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 20, b"payload-20")
    newest = write_checkpoint(tmp_path, 40, b"payload-40")
    (tmp_path / ".tmp-step_000060-1234").mkdir()
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.REBOUND_DEMO
    assert report.latest_valid is not None and report.latest_valid.step == 40
    assert [i.step for i in report.incomplete] == [60]
    (newest.path / "state.pt").write_bytes(b"corrupt")
    assert scan_checkpoints(tmp_path).latest_valid.step == 20  # type: ignore[union-attr]
    (newest.path / "COMPLETE").unlink()
    assert "no COMPLETE marker" in scan_checkpoints(tmp_path).incomplete[1].reason


def test_plain_torch_save_files(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "model_step_10.pt").write_bytes(torch_files.plain)
    (tmp_path / "state.pth").write_bytes(torch_files.plain)  # step read from the file: 42
    (tmp_path / "model_step_50.pt.tmp").write_bytes(b"x")
    report = scan_checkpoints(tmp_path)
    assert report.format is CheckpointFormat.TORCH_SAVE
    assert report.latest_valid is not None and report.latest_valid.path.endswith("state.pth")
    assert report.latest_valid.step == 42
    assert [i.step for i in report.incomplete] == [50]
    truncate(tmp_path / "state.pth")
    assert scan_checkpoints(tmp_path).latest_valid.step == 10  # type: ignore[union-attr]


def test_several_formats_newest_valid_wins(torch_files: Torch, tmp_path: Path) -> None:
    (tmp_path / "epoch=0-step=100.ckpt").write_bytes(torch_files.plain)
    torch_files.copy_dcp(tmp_path / "step-150")
    write_checkpoint(tmp_path, 120, b"p")
    report = scan_checkpoints(tmp_path)
    assert {c.format for c in report.checked} == {
        CheckpointFormat.LIGHTNING,
        CheckpointFormat.TORCHTITAN,
        CheckpointFormat.REBOUND_DEMO,
    }
    assert report.latest_valid is not None and report.latest_valid.step == 150
    assert report.format is CheckpointFormat.TORCHTITAN


def test_missing_empty_and_unreadable_directories(tmp_path: Path) -> None:
    missing = scan_checkpoints(tmp_path / "nope")
    assert missing.error is not None and missing.latest_valid is None
    empty = scan_checkpoints(tmp_path)
    assert empty.error is None and empty.format is None and not empty.checked
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert scan_checkpoints(a_file).error is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_unreadable_checkpoint_is_not_a_verdict(torch_files: Torch) -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="rebound-ckpt-"))  # under /tmp: traversable by another user
    d = torch_files.copy_dcp(tmp_path / "step-100")
    os.chmod(d, 0)
    pid = os.fork()
    if pid == 0:  # as nobody, who may list tmp_path but not the checkpoint
        try:
            os.chmod(tmp_path, 0o755)
            os.setuid(65534)
            report = scan_checkpoints(tmp_path)
            os._exit(0 if [c.status for c in report.checked] == [CheckpointStatus.UNREADABLE] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    os.chmod(d, 0o755)
    shutil.rmtree(tmp_path)
    assert os.waitstatus_to_exitcode(status) == 0


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/rebound-inert-pickle-ran",))


def test_pickled_code_is_never_run(tmp_path: Path) -> None:
    marker = Path("/tmp/rebound-inert-pickle-ran")
    marker.unlink(missing_ok=True)
    loaded = load_inert(pickle.dumps({"step": 3, "payload": _Boom()}))
    assert loaded["step"] == 3 and isinstance(loaded["payload"], Inert)
    assert not marker.exists()
    with pytest.raises(UnreadablePickle):
        load_inert(b"\x80\x04garbage")


def test_torch_save_fields_reads_plain_values(torch_files: Torch, tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(torch_files.megatron[200])
    assert torch_save_fields(path, ("iteration", "args.tensor_model_parallel_size", "model")) == {
        "iteration": 200,
        "args.tensor_model_parallel_size": 2,
    }
