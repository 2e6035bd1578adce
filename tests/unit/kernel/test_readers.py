"""Kernel-log readers: positions across restarts, overruns, truncation; the real /dev/kmsg where it is readable."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import activities.kernel.readers as readers
from activities.kernel.readers import BOOT_ID_PATH, FileKernelLog, KmsgReader, PositionStore, read_boot_id
from workflows.domain.node_events import KernelLogPosition


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_file_log_reads_complete_lines_and_resumes_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "n1.log"
    log = FileKernelLog(path)
    assert log.read().records == ()  # not written yet: nothing, no error
    _append(path, "[  12.345678] first\nsecond\npartial")
    batch = log.read()
    assert [r.message for r in batch.records] == ["first", "second"]  # dmesg's time prefix peeled; partial waits
    assert [r.seq for r in batch.records] == [1, 2] and batch.position.seq == 2
    _append(path, " line\n")
    assert [r.message for r in log.read().records] == ["partial line"]
    store = PositionStore(tmp_path / "state" / "n1.position.json")
    store.save(log.read().position)
    _append(path, "fourth\n")
    restarted = FileKernelLog(path, position=store.load())
    assert [(r.seq, r.message) for r in restarted.read().records] == [(4, "fourth")]


def test_file_log_replaced_or_truncated_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "n1.log"
    path.write_text("a\nb\n")
    log = FileKernelLog(path)
    assert len(log.read().records) == 2
    path.write_text("c\n")  # truncated: a shorter file is a new one
    assert [(r.seq, r.message) for r in log.read().records] == [(1, "c")]
    stale = KernelLogPosition(source=str(path), boot="0:0", seq=5)  # another file's position
    assert [r.message for r in FileKernelLog(path, position=stale).read().records] == ["c"]


def test_file_log_accepts_kmsg_records_and_syslog_lines(tmp_path: Path) -> None:
    path = tmp_path / "n1.log"
    path.write_text("6,10,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, x\nDec  6 06:14:46 n1 kernel: EXT4-fs (sda1): y\n")
    assert [r.message for r in FileKernelLog(path).read().records] == [
        "NVRM: Xid (PCI:0000:3b:00): 79, x",
        "EXT4-fs (sda1): y",
    ]


def test_position_store(tmp_path: Path) -> None:
    store = PositionStore(tmp_path / "p.json")
    assert store.load() is None
    pos = KernelLogPosition(source="/dev/kmsg", boot="b", seq=41)
    store.save(pos)
    assert store.load() == pos
    store.path.write_text("{not json")
    assert store.load() is None  # unreadable: start at the buffer's start (read twice rather than never)


class _FakeKmsg:
    """What read(2) on /dev/kmsg returns, one call at a time: a record, EPIPE, or EAGAIN when nothing is left."""

    def __init__(self, items: list[bytes | int]) -> None:
        self.items = items

    def __call__(self, fd: int, size: int) -> bytes:
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "EAGAIN")
        item = self.items.pop(0)
        if item == errno.EPIPE:
            raise BrokenPipeError(errno.EPIPE, "EPIPE")
        assert isinstance(item, bytes)
        return item


def _rec(seq: int, msg: str = "m") -> bytes:
    return f"6,{seq},{seq * 1000},-;{msg} {seq}\n".encode()


@pytest.fixture
def fake_kmsg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path, _FakeKmsg]]:
    dev = tmp_path / "kmsg"
    dev.write_text("")  # opened, never read: reads go to the fake
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    fake = _FakeKmsg([])
    monkeypatch.setattr(readers, "_os_read", fake)
    yield dev, boot, fake


def test_kmsg_reads_records_until_eagain_and_restarts_after_its_position(
    fake_kmsg: tuple[Path, Path, _FakeKmsg],
) -> None:
    dev, boot, fake = fake_kmsg
    fake.items = [_rec(1), _rec(2), _rec(3)]
    first = KmsgReader(path=dev, boot_id_path=boot)
    batch = first.read()
    assert [r.seq for r in batch.records] == [1, 2, 3] and batch.missed == 0
    assert batch.position == KernelLogPosition(source=str(dev), boot="boot-1", seq=3)
    first.close()
    # Same boot: a new reader opens at the buffer's start and skips what was handled.
    fake.items = [_rec(1), _rec(2), _rec(3), _rec(4)]
    again = KmsgReader(path=dev, boot_id_path=boot, position=batch.position)
    assert [r.seq for r in again.read().records] == [4]


def test_kmsg_new_boot_reads_the_new_buffer_from_its_start(fake_kmsg: tuple[Path, Path, _FakeKmsg]) -> None:
    dev, boot, fake = fake_kmsg
    old = KernelLogPosition(source=str(dev), boot="boot-0", seq=900)
    fake.items = [_rec(0), _rec(1)]
    batch = KmsgReader(path=dev, boot_id_path=boot, position=old).read()
    assert [r.seq for r in batch.records] == [0, 1] and batch.missed == 0 and batch.position.boot == "boot-1"


def test_kmsg_overrun_is_reported_not_fatal(fake_kmsg: tuple[Path, Path, _FakeKmsg]) -> None:
    dev, boot, fake = fake_kmsg
    reader = KmsgReader(path=dev, boot_id_path=boot)
    fake.items = [_rec(1), _rec(2)]
    assert [r.seq for r in reader.read().records] == [1, 2]
    fake.items = [errno.EPIPE, _rec(10), _rec(11)]  # 3..9 overwritten before this read
    batch = reader.read()
    assert [r.seq for r in batch.records] == [10, 11] and batch.missed == 7
    fake.items = [_rec(12)]
    assert reader.read().missed == 0


def test_kmsg_gap_after_a_restart_counts_as_missed(fake_kmsg: tuple[Path, Path, _FakeKmsg]) -> None:
    dev, boot, fake = fake_kmsg
    pos = KernelLogPosition(source=str(dev), boot="boot-1", seq=5)
    fake.items = [_rec(20), _rec(21)]  # the buffer wrapped while the agent was down
    batch = KmsgReader(path=dev, boot_id_path=boot, position=pos).read()
    assert [r.seq for r in batch.records] == [20, 21] and batch.missed == 14


def _kmsg_readable() -> str:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return f"/dev/kmsg not readable here ({e.strerror}): needs root or CAP_SYSLOG with dmesg_restrict=1"
    os.close(fd)
    return ""


@pytest.mark.skipif(bool(_kmsg_readable()), reason=_kmsg_readable() or "readable")
def test_the_real_dev_kmsg() -> None:
    reader = KmsgReader()
    batch = reader.read()
    reader.close()
    assert batch.position.boot == read_boot_id(BOOT_ID_PATH)
    seqs = [r.seq for r in batch.records]
    assert seqs and seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    marker = f"rebound-test {uuid.uuid4()}"
    try:
        with open("/dev/kmsg", "w") as f:  # noqa: PTH123 (a character device)
            f.write(f"<6>{marker}\n")
    except OSError:
        marker = ""  # not writable: the restart check below still holds for what the kernel logs meanwhile
    again = KmsgReader(position=batch.position)
    later = again.read()
    again.close()
    assert all(r.seq > batch.position.seq for r in later.records)  # nothing handled before is read again
    if marker:
        assert any(marker in r.message for r in later.records)
