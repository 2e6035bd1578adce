"""The tail's fast paths (``chunk._split`` without a ``\\r``: lines cut by ``bytes.find``; ``LogTail`` opening a
file by a plain call instead of a generator context manager) read what the code before them read
(``reference_tail``/``reference_chunk``, kept verbatim): the same lines, offsets and fingerprints, on the
repository's test logs and on generated logs appended in uneven pieces, under tight byte and line budgets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from activities.logs.chunk import _split
from activities.logs.tail import LogTail
from tests.unit.logs import reference_chunk, reference_tail
from tests.unit.logs.line_corpus import corpus_files, generated_logs


def _cases() -> list[bytes]:
    return [p.read_bytes() for p in corpus_files()[:60]] + generated_logs()


def test_split_equals_the_old_split() -> None:
    rng = random.Random(3)
    for data in _cases():
        for _ in range(8):
            base = rng.randrange(0, 70)
            offset = base + rng.randrange(0, max(1, min(len(data), 400)))
            piece, count = rng.choice((1 << 20, 64, 7)), rng.choice((10**6, 3, 1))
            chunk = data[: rng.randrange(min(len(data), offset - base), len(data) + 1)]  # holds the old bytes
            old = reference_chunk._split(chunk, base, offset, piece, count)
            assert tuple(_split(chunk, base, offset, piece, count)) == tuple(old)


def test_split_edges_equal_the_old_split() -> None:
    for data in (
        b"",
        b"\n",
        b"\n\n\n",
        b"a",
        b"a\n",
        b"a\nb",
        b"\na\n\nb\n",
        b"a\r",
        b"a\r\n",
        b"x" * 100,
        b"\n" * 5 + b"y",
    ):
        for count in (0, 1, 2, 10):
            for piece in (1, 4, 1 << 20):
                old = reference_chunk._split(data, 0, 0, piece, count)
                assert tuple(_split(data, 0, 0, piece, count)) == tuple(old), data


@pytest.mark.parametrize("budget", [(1 << 20, 1 << 30, 100_000), (37, 200, 5), (4096, 9000, 50)])
def test_tail_reads_what_the_old_tail_read(tmp_path: Path, budget: tuple[int, int, int]) -> None:
    per_file, per_call, lines = budget
    rng = random.Random(sum(budget))
    logs = _cases()[::3]
    files = [tmp_path / f"rank-{i}.log" for i in range(len(logs))]
    for f in files:
        f.write_bytes(b"")
    pattern = [str(tmp_path / "rank-%t.log")]
    new, old = LogTail(pattern), reference_tail.LogTail(pattern)
    new_offsets: dict[str, int] = {}
    old_offsets: dict[str, int] = {}
    written = [0] * len(logs)
    total = 0
    for _ in range(40):
        for i, data in enumerate(logs):  # append an uneven piece of each file: lines cut anywhere, \r\n split
            step = rng.randrange(0, 600)
            with files[i].open("ab") as fh:
                fh.write(data[written[i] : written[i] + step])
            written[i] += step
        got, new_offsets = new.read_lines(
            new_offsets, max_bytes_per_file=per_file, max_bytes_per_call=per_call, max_lines_per_call=lines
        )
        want, old_offsets = old.read_lines(
            old_offsets, max_bytes_per_file=per_file, max_bytes_per_call=per_call, max_lines_per_call=lines
        )
        assert got == want
        total += len(got)
        assert new_offsets == old_offsets
        assert new.refused == old.refused
    assert total > 150  # the comparison is of lines actually read (5 a call at the tightest budget)
