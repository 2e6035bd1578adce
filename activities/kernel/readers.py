"""Readers of a node's kernel log, with positions that survive an agent restart (ADR 016).

``KmsgReader`` follows ``/dev/kmsg``: each ``read(2)`` returns one record; ``EAGAIN`` (non-blocking) means no more
for now; ``EPIPE`` means the kernel overwrote records this reader had not read yet (the ring buffer wrapped): the
next read returns the oldest record still there. That is an overrun, reported (``ReadBatch.missed``), never fatal.
A position is the boot id (``/proc/sys/kernel/random/boot_id``) and the last sequence number handled: a restarted
agent of the same boot opens at the start of the buffer (``SEEK_SET`` 0, the oldest record kept) and skips what it
handled; a new boot (sequence numbers start over) or no position reads the new boot's buffer from its start.
Records missing between the position and the oldest one kept count as missed too.

``FileKernelLog`` follows a file of kernel-style lines (the lab: all its nodes share one kernel, so each node's
agent reads its own file, which ``rebound lab inject kernel`` appends to). Its "boot" is the file's identity
(device and inode) and its sequence the line number; a file replaced or truncated starts over.

``PositionStore`` keeps a position as a small JSON file in the agent's state directory, replaced atomically.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from activities.kernel.lines import parse_kmsg_record
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.node_events import KernelLogPosition, KernelRecord

__all__ = ["BOOT_ID_PATH", "FileKernelLog", "KernelLogReader", "KmsgReader", "PositionStore", "ReadBatch"]

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_os_read = os.read  # one record per call on /dev/kmsg; tests replace it to play EPIPE and EAGAIN
_RECORD_MAX = 8192  # the kernel's records are < 1 KiB of text plus escapes; a short buffer is EINVAL
_MAX_PER_READ = 4096  # records per batch: a full 16 MiB buffer is read over several polls, not in one go
# "<6>[  123.456789] msg" (dmesg -r), "[  123.456789] msg" (dmesg), "Dec  6 06:14:46 n1 kernel: msg" (syslog).
_LINE_PREFIX = re.compile(r"^(?:<\d+>)?(?:\[\s*\d+\.\d+\]\s*)?(?:\w{3} +\d+ [\d:]+ \S+ kernel: )?")


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """Records read since the last batch, and where the reader stands now.

    Attributes:
        records: New records, oldest first.
        position: The position after them (to persist).
        missed: Records lost before they could be read (overrun, or a gap after a restart); 0 normally.
    """

    records: tuple[KernelRecord, ...]
    position: KernelLogPosition
    missed: int = 0


class KernelLogReader(Protocol):
    """A node's kernel log, read incrementally. Synchronous; callers run it in a thread."""

    @property
    def name(self) -> str:
        """What is read (the path), for positions and logs."""
        ...

    def read(self) -> ReadBatch:
        """Records new since the last call (the first call: since the position given at construction).

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the log cannot be opened or read (no permission).
        """
        ...

    def close(self) -> None:
        """Release the file. Idempotent."""
        ...


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's id.

    Raises:
        ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when it cannot be read.
    """
    try:
        return path.read_text().strip()
    except OSError as e:
        raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"boot id {path}: {e}") from e


@dataclass(slots=True)
class KmsgReader:
    """``/dev/kmsg``, non-blocking, from ``position`` (None: the start of this boot's buffer)."""

    path: Path = Path("/dev/kmsg")
    position: KernelLogPosition | None = None
    boot_id_path: Path = BOOT_ID_PATH
    _fd: int | None = field(default=None, init=False)
    _boot: str = field(default="", init=False)
    _last: int = field(default=-1, init=False)

    @property
    def name(self) -> str:
        return str(self.path)

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        self._boot = read_boot_id(self.boot_id_path)
        pos = self.position
        same_boot = pos is not None and pos.source == self.name and pos.boot == self._boot
        self._last = pos.seq if same_boot and pos is not None else -1
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"kernel log {self.path}: {e}") from e
        # SEEK_SET 0: the oldest record the buffer still holds (not SEEK_DATA, which skips what `dmesg -C` cleared:
        # an operator clearing the buffer must not hide a fault from Rebound).
        with contextlib.suppress(OSError):
            os.lseek(fd, 0, os.SEEK_SET)
        self._fd = fd
        return fd

    def read(self) -> ReadBatch:
        fd = self._open()
        records: list[KernelRecord] = []
        missed = 0
        overrun = False
        while len(records) < _MAX_PER_READ:
            try:
                raw = _os_read(fd, _RECORD_MAX)
            except BlockingIOError:
                break  # EAGAIN: nothing more for now
            except BrokenPipeError:
                overrun = True  # EPIPE: overwritten under us; the next read resumes at the oldest record kept
                continue
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"kernel log {self.path}: {e}") from e
            if not raw:
                break
            record = parse_kmsg_record(raw)
            if record is None or record.seq <= self._last:
                continue  # handled before this restart (or not a record)
            if self._last >= 0 and record.seq > self._last + 1:
                missed += record.seq - self._last - 1
            elif self._last < 0 and overrun:
                missed += 1  # an overrun before the first record: at least one lost, how many is unknown
            overrun = False
            self._last = record.seq
            records.append(record)
        if overrun:
            missed = max(missed, 1)
        return ReadBatch(tuple(records), KernelLogPosition(source=self.name, boot=self._boot, seq=self._last), missed)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


@dataclass(slots=True)
class FileKernelLog:
    """A file of kernel-style lines, one message per line, appended to (the lab's per-node kernel log)."""

    path: Path
    position: KernelLogPosition | None = None
    _identity: str = field(default="", init=False)
    _offset: int = field(default=0, init=False)
    _seq: int = field(default=0, init=False)
    _skip: int = field(default=0, init=False)

    @property
    def name(self) -> str:
        return str(self.path)

    def read(self) -> ReadBatch:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            # Not written yet: nothing to read (the lab creates it on the first injection).
            return ReadBatch((), KernelLogPosition(source=self.name, boot=self._identity, seq=self._seq))
        except OSError as e:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"kernel log {self.path}: {e}") from e
        identity = f"{st.st_dev}:{st.st_ino}"
        if identity != self._identity or st.st_size < self._offset:
            pos = self.position if not self._identity else None
            self._identity, self._offset, self._seq = identity, 0, 0
            # The first read after a restart skips the lines the position says were handled.
            self._skip = pos.seq if pos is not None and pos.source == self.name and pos.boot == identity else 0
        if st.st_size == self._offset:
            return ReadBatch((), KernelLogPosition(source=self.name, boot=identity, seq=self._seq))
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError as e:
            raise ReboundError(FailureKind.GPU_SOURCE_UNAVAILABLE, f"kernel log {self.path}: {e}") from e
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offset += len(complete)
        records: list[KernelRecord] = []
        for line in complete.decode("utf-8", "replace").splitlines():
            self._seq += 1
            if self._seq <= self._skip:
                continue
            kmsg = parse_kmsg_record(line) if ";" in line else None
            message = kmsg.message if kmsg is not None else _LINE_PREFIX.sub("", line, count=1)
            records.append(KernelRecord(seq=self._seq, message=message))
        return ReadBatch(tuple(records), KernelLogPosition(source=self.name, boot=identity, seq=self._seq))

    def close(self) -> None:
        """Nothing held between reads."""


@dataclass(frozen=True, slots=True)
class PositionStore:
    """One reader's position in a JSON file (the agent's state directory)."""

    path: Path

    def load(self) -> KernelLogPosition | None:
        """The saved position, or None (none saved, or unreadable: then the reader starts at the buffer's start,
        erring towards reading a record twice rather than never)."""
        try:
            return KernelLogPosition.model_validate_json(self.path.read_text())
        except (OSError, ValueError):
            return None

    def save(self, position: KernelLogPosition) -> None:
        """Replace the saved position atomically (a crash leaves the old one or the new one, never half)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(position.model_dump_json())
        os.replace(tmp, self.path)
