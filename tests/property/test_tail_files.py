"""LogTail against whatever can happen to a log file between two polls, driven by a hypothesis state machine.

The watched path ``a.log`` is appended to in arbitrary cuts (mid-line, mid-UTF-8 sequence, between the two bytes
of a CRLF), rotated (renamed, recreated), truncated and rewritten, truncated keeping a prefix, deleted, replaced
by a symlink (to a new file, to a directory, to nothing, to itself), by a FIFO or by a directory, and made
unreadable. A second file ``b.log`` keeps growing beside it, so the per-call budget has two files to share.
Every line written carries a unique id (``#17#``) amid junk bytes (invalid UTF-8, NUL, bare CR), and after every
read the machine checks:

* no exception escapes, and the reader never blocks (a FIFO is not opened);
* no id is returned twice (except the ids of a kept prefix: a file truncated to a shorter length that still starts
  with lines already read cannot be told from a new file, so those are read again; documented in ``tail``);
* an offset never goes backwards unless the file at the path was replaced, truncated or rotated since;
* a refused or vanished file keeps its offset;
* once the files stop changing, reading until nothing is new returns every complete line of the current files:
  nothing is lost but what a rotation or a truncation took away before it was read.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from activities.logs.line import LogLine
from activities.logs.tail import LogTail, positions

_ID = re.compile(r"#(\d+)#")
# Junk between the id and the end of the line: invalid UTF-8, a cut multi-byte sequence, NUL, a bare CR (a line
# break of its own to the reader), a whole character. Never "#", so no id is forged.
_JUNK = st.lists(
    st.sampled_from([b"x", b" ", b"\x00", b"\xff", b"\xe2\x82", b"\xc3", "é".encode(), "🏖".encode(), b"\r", b"="]),
    max_size=8,
).map(b"".join)
_EOL = st.sampled_from([b"\n", b"\r\n"])
_MAX_LINE = 2 + 12 + 8 * 4 + 2  # "#", id digits, "#", junk, CRLF


def _complete_lines(content: bytes) -> list[bytes]:
    """The lines a reader of the whole ``content`` must return, by an independent splitter."""
    pieces = content.splitlines(keepends=True)
    out = []
    for i, piece in enumerate(pieces):
        body = piece.rstrip(b"\r\n")
        final_cr = i == len(pieces) - 1 and piece.endswith(b"\r")  # may still become CRLF: not complete yet
        if piece != body and not final_cr and body:
            out.append(body)
    return out


def _ids(data: bytes | str) -> list[int]:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return [int(m) for m in _ID.findall(text)]


class _File:
    """A regular file the model writes, with the bytes it holds and the stream of bytes still to append."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.content = b""
        self.stream = b""
        self.lossy = False
        """Truncated keeping a prefix, then written to: the fingerprint may see the old file (see ``_check``)."""
        path.write_bytes(b"")


class TailMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tail-prop-"))
        self.main = self.dir / "a.log"
        self.next_id = 0
        self.files: dict[Path, _File] = {}
        self.seen: set[int] = set()
        self.repeatable: set[int] = set()  # ids of a kept prefix, which may come again
        self.offsets: dict[str, int] = {}
        self.reset = True  # the file at a path changed identity since the last read
        self.denied = False
        self.tail = LogTail([str(self.dir / "*.log")])
        self.serial = 0

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- what the model says is at the watched paths ---

    def _target(self, path: Path) -> _File | None:
        """The model file read through ``path`` (following our one-level symlinks), if it is a regular file."""
        if path.is_symlink():
            return self.files.get(Path(os.readlink(path)))
        return self.files.get(path) if path.is_file() else None

    def _new_file(self, path: Path) -> _File:
        f = _File(path)
        self.files[path] = f
        return f

    def _lines(self, count: int, junk: list[bytes], eols: list[bytes]) -> bytes:
        out = b""
        for i in range(count):
            out += b"#%d#" % self.next_id + junk[i % len(junk)] + eols[i % len(eols)]
            self.next_id += 1
        return out

    @initialize()
    def start(self) -> None:
        self._new_file(self.main)
        self._new_file(self.dir / "b.log")

    # --- writers ---

    @rule(
        which=st.sampled_from(["a", "b"]),
        count=st.integers(1, 6),
        junk=st.lists(_JUNK, min_size=1, max_size=3),
        eols=st.lists(_EOL, min_size=1, max_size=3),
        cut=st.integers(0, 200),
    )
    def append(self, which: str, count: int, junk: list[bytes], eols: list[bytes], cut: int) -> None:
        """Queue ``count`` new lines, then write an arbitrary prefix of everything queued."""
        f = self._target(self.dir / f"{which}.log")
        if f is None:
            return
        f.stream += self._lines(count, junk, eols)
        data, f.stream = f.stream[:cut], f.stream[cut:]
        with f.path.open("ab") as out:
            out.write(data)
        f.content += data

    @rule()
    def rotate(self) -> None:
        """logrotate's default: rename the file away (out of the pattern), start a new one."""
        if self.main.is_file() and not self.main.is_symlink():
            self.main.rename(self.dir / f"a.log.{self.serial}")
            self.serial += 1
            self.files.pop(self.main, None)
        self._clear_main()
        self._new_file(self.main)
        self.reset = True

    @rule(count=st.integers(0, 4), junk=st.lists(_JUNK, min_size=1, max_size=2))
    def truncate_and_rewrite(self, count: int, junk: list[bytes]) -> None:
        """srun --open-mode=truncate on a requeue: same inode, new content, shorter or longer than before."""
        f = self._target(self.main)
        if f is None:
            return
        f.content = f.stream = b""
        data = self._lines(count, junk, [b"\n"])
        f.path.write_bytes(data)
        f.content = data
        self.reset = True

    @rule(keep=st.integers(0, 300))
    def truncate_keeping_a_prefix(self, keep: int) -> None:
        f = self._target(self.main)
        if f is None or keep >= len(f.content):
            return
        os.truncate(f.path, keep)
        # Ids of every line that starts in the kept prefix may come again: the line cut by the truncation too (its
        # kept start, completed by later bytes, is a line the reader has not seen in that form).
        cut_line_end = f.content.find(b"\n", keep)
        self.repeatable |= set(_ids(f.content[: len(f.content) if cut_line_end < 0 else cut_line_end]))
        f.content, f.stream = f.content[:keep], b""
        f.lossy = True
        self.reset = True

    @rule(kind=st.sampled_from(["delete", "file_link", "dir_link", "dangling", "loop", "fifo", "dir"]))
    def replace(self, kind: str) -> None:
        """The path stops being the regular file it was."""
        self._clear_main()
        if kind == "file_link":  # a fresh target every time: a path that points back at old content re-reads it
            target = self.dir / "targets" / f"t{self.serial}.log"
            self.serial += 1
            target.parent.mkdir(exist_ok=True)
            self._new_file(target)
            self.main.symlink_to(target)
        elif kind == "dir_link":
            self.main.symlink_to(self.dir)
        elif kind == "dangling":
            self.main.symlink_to(self.dir / "nowhere")
        elif kind == "loop":
            self.main.symlink_to(self.main)
        elif kind == "fifo":
            os.mkfifo(self.main)
        elif kind == "dir":
            self.main.mkdir()
        self.reset = True

    @rule(denied=st.booleans())
    def permission(self, denied: bool) -> None:
        self.denied = denied

    def _clear_main(self) -> None:
        if self.main.is_dir() and not self.main.is_symlink():
            self.main.rmdir()
        elif self.main.exists() or self.main.is_symlink():
            self.main.unlink()
        self.files.pop(self.main, None)

    # --- the reader ---

    @rule(
        restart=st.booleans(),
        per_file=st.integers(_MAX_LINE, 400),
        per_call=st.integers(_MAX_LINE, 600),
    )
    def read(self, restart: bool, per_file: int, per_call: int) -> None:
        if restart:  # a new activity attempt: a fresh object, the state only through JSON
            self.tail = LogTail([str(self.dir / "*.log")])
            self.offsets = json.loads(json.dumps(self.offsets))
        before = positions(self.offsets)
        lines, after = self._read(per_file, per_call)
        self._check(lines, before, positions(after))
        self.offsets = after

    def _read(self, per_file: int, per_call: int) -> tuple[list[LogLine], dict[str, int]]:
        if not self.denied:
            return self.tail.read_new(self.offsets, max_bytes_per_file=per_file, max_bytes_per_call=per_call)
        real_open, main = os.open, str(self.main)

        def deny(path: str, *args: object, **kwargs: object) -> int:
            if str(path) == main:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        with mock.patch("os.open", deny):
            result = self.tail.read_new(self.offsets, max_bytes_per_file=per_file, max_bytes_per_call=per_call)
        if self._target(self.main) is not None:  # refused, unless it had to wait for the budget
            assert self.tail.refused.get(main, "cannot open: Permission denied") == "cannot open: Permission denied"
        return result

    def _check(self, lines: list[LogLine], before: dict[str, int], after: dict[str, int]) -> None:
        ids = [i for line in lines for i in _ids(line.text)]
        again = [i for i in ids if i in self.seen and i not in self.repeatable]
        assert not again, f"ids {again} returned twice"
        assert len(ids) == len(set(ids))
        self.seen |= set(ids)
        for path, offset in after.items():
            old = before.get(path, 0)
            if path != str(self.main) or not self.reset:
                assert offset >= old, f"{path}: offset went back from {old} to {offset} with no rotation"
            target = self._target(Path(path))
            if target is not None and offset != old:  # (a file left waiting for the budget keeps a stale one)
                assert offset <= len(target.content)
        if self._target(self.main) is None or self.denied:
            assert after.get(str(self.main)) == before.get(str(self.main))  # not read: offset kept
        if after.get(str(self.main)) != before.get(str(self.main)):
            self.reset = False  # the change was seen (a file that waited for the budget has not seen it yet)
        for line in lines:
            assert line.path in {str(self.main), str(self.dir / "b.log")}

    @invariant()
    def refused_is_a_report(self) -> None:
        assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in self.tail.refused.items())

    @rule()
    def settle(self) -> None:
        """Nothing changes any more: reading until nothing is new returns every complete line still on disk."""
        self.denied = False
        for _ in range(100):
            before = positions(self.offsets)
            lines, after = self.tail.read_new(self.offsets, max_bytes_per_file=512, max_bytes_per_call=1024)
            self._check(lines, before, positions(after))
            done = not lines and after == self.offsets
            self.offsets = after
            if done:
                break
        else:
            raise AssertionError("the reader never caught up")
        for name in ("a.log", "b.log"):
            f = self._target(self.dir / name)
            # A kept prefix followed by new bytes can fool the 64-byte fingerprint (the old window's bytes may
            # match where the new ones start): lines written after such a truncation may be skipped.
            if f is not None and not f.lossy:
                missing = {i for line in _complete_lines(f.content) for i in _ids(line)} - self.seen
                assert not missing, f"{name}: ids {sorted(missing)} never returned"


TailMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_tail_survives_whatever_happens_to_its_files = TailMachine.TestCase
