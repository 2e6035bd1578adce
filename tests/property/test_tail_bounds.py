"""What one ``LogTail.read_new`` call may cost, measured with tracemalloc, and what keeps it bounded.

Measured at the defaults (1 MiB per file, 4 MiB and 10k lines per call) on the development machine: a 10 MB
single line 6.0 MiB per call; a 200 MB file of 100-byte lines 14.4 MiB (10k ``LogLine`` objects at about 1.4 KB
each are most of it); the worst content found (10k lines of 400 undecodable bytes over 8 files) 23.8 MiB. The
bounds below sit above those; without the per-call limits, 1 MiB of two-byte lines alone made 524k lines
(about 600 MB), and a call over many files read 1 MiB from each.
"""

from __future__ import annotations

import glob
import os
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.logs import globbing
from activities.logs.line import LogLine
from activities.logs.tail import (
    DEFAULT_MAX_BYTES_PER_CALL,
    DEFAULT_MAX_BYTES_PER_FILE,
    DEFAULT_MAX_LINES_PER_CALL,
    LogTail,
    positions,
)

MiB = 1 << 20


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def _read(t: LogTail, offsets: dict[str, int]) -> tuple[list[LogLine], dict[str, int], int]:
    """One call with the defaults, and the peak of what it allocated."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    lines, new = t.read_new(offsets)
    return lines, new, tracemalloc.get_traced_memory()[1] - before


def test_a_10_mb_line_comes_in_whole_characters_within_8_mib(tmp_path: Path, traced: None) -> None:
    unit = "é🏖x"  # 2 + 4 + 1 bytes: pieces of 1 MiB land inside multi-byte characters
    text = unit * (10_000_000 // len(unit.encode()))
    log = tmp_path / "long.log"
    log.write_bytes(text.encode() + b"\nafter\n")
    t, pieces = LogTail([str(log)]), []
    offsets: dict[str, int] = {}
    for _ in range(20):
        lines, offsets, peak = _read(t, offsets)
        assert peak < 8 * MiB
        pieces += lines
        if lines and lines[-1].text == "after":
            break
    assert [p.text for p in pieces[-1:]] == ["after"]
    body = pieces[:-1]
    assert 10 <= len(body) <= 11 and all(len(p.text.encode()) <= DEFAULT_MAX_BYTES_PER_FILE for p in body)
    assert "".join(p.text for p in body) == text  # cut between characters: no U+FFFD, nothing lost
    assert [p.offset for p in body] == [0] + [sum(len(p.text.encode()) for p in body[:i]) for i in range(1, len(body))]


def test_a_200_mb_file_is_read_a_budget_at_a_time(tmp_path: Path, traced: None) -> None:
    line = b"2026-11-30T03:40:01.123Z [INFO] rank=1/4 node=n1 step=120 loss=0.4123 step_time=0.105s xxxxxxxxxxxxx\n"
    big = tmp_path / "big.log"
    with big.open("wb") as out:
        block = line * (MiB // len(line))
        while out.tell() < 200_000_000:
            out.write(block)
    size = big.stat().st_size
    t = LogTail([str(big)])
    for start in (0, size // 2 // len(line) * len(line), size - 300 * len(line)):
        started = time.perf_counter()
        lines, offsets, peak = _read(t, {str(big): start})
        assert time.perf_counter() - started < 5
        assert peak < 16 * MiB
        assert 0 < positions(offsets)[str(big)] - start <= DEFAULT_MAX_BYTES_PER_FILE
        assert len(lines) <= DEFAULT_MAX_LINES_PER_CALL
        assert {x.text for x in lines} == {line.decode().rstrip("\n")}


def _tiny(d: Path) -> None:
    (d / "tiny.log").write_bytes(b"a\n" * 3_000_000)


def _undecodable(d: Path) -> None:
    for i in range(8):
        (d / f"bad-{i}.log").write_bytes((b"\xff" * 400 + b"\n") * 2_800)


def _many(d: Path) -> None:
    for i in range(40):
        (d / f"m-{i:02d}.log").write_bytes((b"x" * 99 + b"\n") * 20_000)


@pytest.mark.parametrize("fill", [_tiny, _undecodable, _many])
def test_no_content_makes_a_call_cost_more_than_32_mib(tmp_path: Path, traced: None, fill: object) -> None:
    fill(tmp_path)  # type: ignore[operator]
    t = LogTail([str(tmp_path / "*.log")])
    lines, offsets, peak = _read(t, {})
    assert peak < 32 * MiB
    assert len(lines) <= DEFAULT_MAX_LINES_PER_CALL
    assert sum(positions(offsets).values()) <= DEFAULT_MAX_BYTES_PER_CALL


def test_a_file_left_waiting_goes_first_next_time(tmp_path: Path) -> None:
    """A rank that logs a little every poll must not keep another rank's backlog waiting forever."""
    busy, behind = tmp_path / "a-busy.log", tmp_path / "b-behind.log"
    behind.write_bytes(b"y" * 99 + b"\n" + b"z" * 900 + b"\n")  # 1000 bytes: needs a whole budget
    t, got = LogTail([str(tmp_path / "*.log")]), []
    offsets: dict[str, int] = {}
    for i in range(4):
        with busy.open("ab") as out:
            out.write(b"busy %d\n" % i)  # a smaller backlog every time: it sorts first
        lines, offsets = t.read_new(offsets, max_bytes_per_file=1000, max_bytes_per_call=1000)
        got += [line.text[:4] for line in lines]
    assert got.count("zzzz") == 1 and got.count("yyyy") == 1
    assert got.index("yyyy") <= 2  # waited once at most


def test_the_line_budget_keeps_order_and_loses_nothing(tmp_path: Path) -> None:
    for name in ("a.log", "b.log"):
        (tmp_path / name).write_text("".join(f"{name} {i}\n" for i in range(25)))
    t, got = LogTail([str(tmp_path / "*.log")]), []
    offsets: dict[str, int] = {}
    for _ in range(10):
        lines, offsets = t.read_new(offsets, max_lines_per_call=7)
        assert len(lines) <= 7
        got += [line.text for line in lines]
    assert sorted(got) == sorted(f"{n} {i}" for n in ("a.log", "b.log") for i in range(25))
    assert [x for x in got if x.startswith("a")] == [f"a.log {i}" for i in range(25)]


def test_double_star_over_symlink_loops_is_quick_and_reads_each_file_once(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "run1").mkdir(parents=True)
    (logs / "run1" / "rank-0.log").write_text("hello\n")
    for name in ("a", "b", "c"):  # glob itself walks 3**40 paths here (ELOOP stops it at depth 40)
        (logs / name).symlink_to(".")
    (logs / "latest").symlink_to("run1")
    started = time.perf_counter()
    t = LogTail([str(logs / "**" / "*.log")])
    lines, _ = t.read_new({})
    assert time.perf_counter() - started < 1
    assert [(line.text, line.rank) for line in lines] == [("hello", 0)]  # not once per alias
    assert t.refused == {}


def test_the_glob_walk_is_bounded_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(globbing, "MAX_GLOB_ENTRIES", 500)
    for i in range(30):
        d = tmp_path / f"d{i}"
        d.mkdir()
        for j in range(30):
            (d / f"f{j}.txt").touch()
    pattern = str(tmp_path / "**" / "*.log")
    t = LogTail([pattern])
    started = time.perf_counter()
    assert t.read_new({}) == ([], {})
    assert time.perf_counter() - started < 1
    assert t.refused == {
        pattern: "the patterns reach more than 500 directory entries (logs.glob_max_entries): refused until the "
        "job's next attempt; name the files more narrowly"
    }


_NAMES = ["a", "b", "ab", ".h", "rank-1.log", "x.log", ".x.log"]


@st.composite
def _trees(draw: st.DrawFn) -> list[tuple[str, bool]]:
    """Up to 25 entries (path, is_dir) of a tree three levels deep, without symlinks."""
    entries: dict[str, bool] = {}
    for _ in range(draw(st.integers(0, 25))):
        parts = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3))
        for depth in range(1, len(parts)):
            if entries.get("/".join(parts[:depth]), True) is False:
                break  # a file already: nothing below it
            entries["/".join(parts[:depth])] = True
        else:
            entries.setdefault("/".join(parts), draw(st.booleans()))
    return sorted(entries.items())


_COMPONENTS = ["*", "**", "?", "a*", "[ab]", "[!a]*", ".*", "*.log", "x.log", "a", "rank-?.log", "*b"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=_trees(), parts=st.lists(st.sampled_from(_COMPONENTS), min_size=1, max_size=4))
def test_the_bounded_glob_matches_what_glob_matches(
    tmp_path: Path, tree: list[tuple[str, bool]], parts: list[str]
) -> None:
    """Without symlinks, the walk that replaced ``glob.glob(recursive=True)`` finds exactly the same paths."""
    base = tmp_path / uuid.uuid4().hex
    base.mkdir()
    for path, is_dir in tree:
        if is_dir:
            (base / path).mkdir(parents=True, exist_ok=True)
        elif not (base / path).exists():
            (base / path).parent.mkdir(parents=True, exist_ok=True)
            (base / path).touch()
    pattern = str(base) + "/" + "/".join(parts)
    # glob's one quirk is not copied: "file/**" yields "file/" although a file has nothing below it.
    expected = {p.rstrip("/") for p in glob.glob(pattern, recursive=True) if not p.endswith("/") or os.path.isdir(p)}
    assert set(globbing.bounded_glob(pattern, globbing.GlobBudget())) == expected
