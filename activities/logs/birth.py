"""When a file was created (its birth time), where the kernel and the file system say: Linux ``statx`` through
glibc (2.28+), called on an open descriptor so it describes exactly the file being read.

Python 3.11's ``os.stat`` has no birth time on Linux. ext4, xfs, btrfs and tmpfs record one; NFS and many parallel
file systems do not, and then the answer is None: the caller must treat the creation time as unknown, never as
"old" or "new".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from datetime import UTC, datetime
from functools import cache

__all__ = ["birth_time"]

_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_STATX_SIZE = 256  # struct statx, padding included (linux/stat.h)
_MASK = struct.Struct("=I")  # stx_mask, at offset 0
_BTIME = struct.Struct("=qI")  # stx_btime: tv_sec (s64), tv_nsec (u32), at offset 80
_BTIME_OFFSET = 80


@cache
def _statx() -> object | None:
    """glibc's ``statx``, or None where there is none (another libc, an old glibc, not Linux)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        function = libc.statx
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


def birth_time(fd: int) -> datetime | None:
    """When the file open at ``fd`` was created; None when the system or the file system does not say."""
    function = _statx()
    if function is None or not callable(function):
        return None
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if function(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, buffer) != 0:
        return None
    raw = buffer.raw
    if not _MASK.unpack_from(raw, 0)[0] & _STATX_BTIME:
        return None
    seconds, nanos = _BTIME.unpack_from(raw, _BTIME_OFFSET)
    if seconds <= 0:
        return None
    try:
        return datetime.fromtimestamp(seconds + nanos / 1e9, UTC)
    except (OverflowError, OSError, ValueError):
        return None
