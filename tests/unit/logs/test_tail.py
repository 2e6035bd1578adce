"""LogTail: complete lines only, growth, truncation and replacement, new and missing files, restart safety."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs import tail
from activities.logs.line import LogLine, rank_token, split_prefix
from activities.logs.patterns import expand_patterns
from activities.logs.tail import LogTail, positions
from workflows.domain.slurm import JobState, SlurmJob


def _append(path: Path, data: bytes | str) -> None:
    with path.open("ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _texts(lines: list[LogLine]) -> list[str]:
    return [line.text for line in lines]


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "job-5-rank-0.log"
    _append(log, "one\ntwo\nthr")
    t = LogTail([str(tmp_path / "*.log")])

    lines, offsets = t.read_new({})
    assert _texts(lines) == ["one", "two"]
    assert [line.offset for line in lines] == [0, 4]
    assert positions(offsets) == {str(log): 8}

    again, same = t.read_new(offsets)
    assert again == [] and same == offsets

    _append(log, "ee\nfour\n")
    lines, offsets = t.read_new(offsets)
    assert [(line.text, line.offset) for line in lines] == [("three", 8), ("four", 14)]
    assert positions(offsets) == {str(log): 19}


def test_crlf_and_carriage_return_redraws(tmp_path: Path) -> None:
    log = tmp_path / "train.out"
    # A progress bar redraws with \r; a lone \r at the end may still become \r\n, so it waits.
    _append(log, "a\r\nb\r\n\rEpoch 0: 1/10\rEpoch 0: 2/10\r")
    t = LogTail([str(log)])
    lines, offsets = t.read_new({})
    assert _texts(lines) == ["a", "b", "Epoch 0: 1/10"]
    _append(log, "\nnext\n")
    more, _ = t.read_new(offsets)
    assert _texts(more) == ["Epoch 0: 2/10", "next"]


def test_truncated_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, "old line 1\nold line 2\n")
    t = LogTail([str(log)])
    _, offsets = t.read_new({})
    log.write_bytes(b"new\n")
    lines, offsets = t.read_new(offsets)
    assert _texts(lines) == ["new"]
    assert positions(offsets) == {str(log): 4}


def test_rewritten_past_the_old_offset_is_detected(tmp_path: Path) -> None:
    # srun --open-mode=truncate on a requeue: same inode, and the new attempt may out-write the old one before
    # the next poll. The size check alone would start mid-line in the new content.
    log = tmp_path / "a.log"
    _append(log, "attempt 0 started\n")
    t = LogTail([str(log)])
    _, offsets = t.read_new({})
    log.write_bytes(b"attempt 1 started, and a longer line\nresumed from checkpoint step_000010\n")
    lines, _ = t.read_new(offsets)
    assert _texts(lines) == ["attempt 1 started, and a longer line", "resumed from checkpoint step_000010"]


def test_replaced_file_is_read_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, "x" * 100 + "\n")
    t = LogTail([str(log)])
    _, offsets = t.read_new({})
    log.rename(tmp_path / "a.log.1")  # rotation by rename, then a new file, already longer than the offset
    _append(log, "y" * 120 + "\nz\n")
    lines, _ = t.read_new(offsets)
    assert _texts(lines) == ["y" * 120, "z"]


def test_hand_written_offsets_without_fingerprint_are_trusted(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, "skip me\nread me\n")
    lines, offsets = LogTail([str(log)]).read_new({str(log): 8})
    assert _texts(lines) == ["read me"]
    assert set(offsets) == {str(log), "\x00crc:" + str(log)}


def test_new_files_start_at_zero_and_missing_ones_are_fine(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    t = LogTail([str(logs / "job-5-rank-%t.log"), str(tmp_path / "nowhere" / "*.log")])
    assert t.read_new({}) == ([], {})

    logs.mkdir()
    _append(logs / "job-5-rank-0.log", "r0 a\n")
    lines, offsets = t.read_new({})
    assert [(line.rank, line.text) for line in lines] == [(0, "r0 a")]

    _append(logs / "job-5-rank-1.log", "r1 a\n")
    _append(logs / "job-5-rank-0.log", "r0 b\n")
    lines, offsets = t.read_new(offsets)
    assert [(line.rank, line.text) for line in lines] == [(0, "r0 b"), (1, "r1 a")]

    # A file that vanished keeps its offset: if it comes back, the fingerprint decides where to read.
    (logs / "job-5-rank-1.log").unlink()
    lines, after = t.read_new(offsets)
    assert lines == [] and after == offsets


def test_binary_junk_is_replaced_not_fatal(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, b"ok\n\xff\xfe\x00bin\x80ary\n" + "café 🏖️\n".encode())
    lines, _ = LogTail([str(log)]).read_new({})
    assert _texts(lines) == ["ok", "\ufffd\ufffd\x00bin\ufffdary", "café 🏖️"]
    json.dumps([line.model_dump(mode="json") for line in lines])


def test_directories_and_fifos_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "dir.log").mkdir()
    os.mkfifo(tmp_path / "fifo.log")  # opening it for reading must not block the activity
    _append(tmp_path / "real.log", "line\n")
    lines, offsets = LogTail([str(tmp_path / "*.log")]).read_new({})
    assert _texts(lines) == ["line"]
    assert positions(offsets) == {str(tmp_path / "real.log"): 5}


@pytest.mark.parametrize("bad", [-5, "12", 3.5, None, True, float("inf"), float("nan"), 10**30, [1]])
def test_malformed_offsets_read_from_the_start(tmp_path: Path, bad: object) -> None:
    log = tmp_path / "a.log"
    _append(log, "one\ntwo\n")
    offsets = {str(log): bad, "\x00crc:" + str(log): "not a crc"}
    lines, new = LogTail([str(log)]).read_new(offsets)  # type: ignore[arg-type]  # deliberately malformed
    assert _texts(lines) == ["one", "two"]  # 10**30 is past the end: truncation, so from 0 as well
    assert positions(new) == {str(log): 8}


def test_bad_patterns_match_nothing(tmp_path: Path) -> None:
    assert LogTail(["bad\x00pattern", str(tmp_path / "[unclosed")]).read_new({}) == ([], {})


def test_max_bytes_per_file_reads_the_rest_next_time(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, "".join(f"line {i:02d}\n" for i in range(10)))  # 8 bytes each
    t = LogTail([str(log)])
    lines, offsets = t.read_new({}, max_bytes_per_file=20)
    assert _texts(lines) == ["line 00", "line 01"]
    seen = _texts(lines)
    for _ in range(10):
        lines, offsets = t.read_new(offsets, max_bytes_per_file=20)
        seen += _texts(lines)
    assert seen == [f"line {i:02d}" for i in range(10)]


def test_a_line_longer_than_the_budget_comes_in_pieces_and_never_loops(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    _append(log, "a" * 25 + "\nshort\n")
    t = LogTail([str(log)])
    got: list[str] = []
    offsets: dict[str, int] = {}
    for _ in range(10):
        lines, offsets = t.read_new(offsets, max_bytes_per_file=10)
        got += _texts(lines)
    assert got == ["a" * 10, "a" * 10, "aaaaa", "short"]


def test_restart_from_heartbeated_offsets_neither_rereads_nor_misses(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in (0, 1):
        _append(logs / f"job-9-rank-{rank}.log", f"rank {rank} step=1\nrank {rank} step=2\nrank {rank} st")
    patterns = expand_patterns([str(logs / "job-%j-rank-%t.log")], 9)

    first, offsets = LogTail(patterns).read_new({})
    heartbeat = json.dumps(offsets)  # what the activity heartbeated before its worker died

    for rank in (0, 1):
        _append(logs / f"job-9-rank-{rank}.log", f"ep=3\nrank {rank} step=4\n")
    # A new worker, a new LogTail, only the heartbeated JSON.
    second, _ = LogTail(patterns).read_new(json.loads(heartbeat))

    seen = [(line.path, line.offset) for line in first + second]
    assert len(seen) == len(set(seen))
    by_rank = {r: [line.text for line in first + second if line.rank == r] for r in (0, 1)}
    assert by_rank[1] == ["rank 1 step=1", "rank 1 step=2", "rank 1 step=3", "rank 1 step=4"]
    assert by_rank[0] == ["rank 0 step=1", "rank 0 step=2", "rank 0 step=3", "rank 0 step=4"]


_TOKENS = [b"a", b"Z", b" ", b"=", b"\x00", b"\xff", b"\xe2\x82", "é".encode(), "🏖️".encode(), b"step=1"]
_TERMINATORS = [b"\n", b"\r\n", b"\r"]
_MAX_LINE = 3 * 8 + 2  # longest body of _line_st plus a terminator


@st.composite
def _line_st(draw: st.DrawFn) -> bytes:
    body = b"".join(draw(st.lists(st.sampled_from(_TOKENS), max_size=3)))
    return body + draw(st.sampled_from(_TERMINATORS))


def _reference(content: bytes) -> list[tuple[int, str]]:
    """The complete lines of the whole file read at once, by an independent splitter (bytes.splitlines)."""
    out: list[tuple[int, str]] = []
    pos = 0
    pieces = content.splitlines(keepends=True)
    for i, piece in enumerate(pieces):
        body = piece.rstrip(b"\r\n")
        complete = piece != body and not (i == len(pieces) - 1 and piece.endswith(b"\r"))
        if complete and body:
            out.append((pos, body.decode("utf-8", errors="replace")))
        pos += len(piece)
    return out


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(_line_st(), max_size=25),
    tail_bytes=st.binary(max_size=5).filter(lambda b: b"\n" not in b and b"\r" not in b),
    cuts=st.lists(st.integers(0, 400), max_size=12),
    actions=st.lists(st.tuples(st.booleans(), st.integers(_MAX_LINE, 80)), min_size=12, max_size=12),
)
def test_incremental_reads_with_restarts_equal_one_read_of_the_final_file(
    lines: list[bytes], tail_bytes: bytes, cuts: list[int], actions: list[tuple[bool, int]]
) -> None:
    content = b"".join(lines) + tail_bytes
    bounds = sorted({min(c, len(content)) for c in cuts} | {len(content)})
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "rank-0.log"
        log.touch()
        t = LogTail([str(log)])
        offsets: dict[str, int] = {}
        got: list[tuple[int, str]] = []
        written = 0
        for bound, (restart, budget) in zip(bounds, actions, strict=False):
            _append(log, content[written:bound])
            written = bound
            if restart:  # a new activity attempt: fresh object, state only through JSON
                t, offsets = LogTail([str(log)]), json.loads(json.dumps(offsets))
            new, offsets = t.read_new(offsets, max_bytes_per_file=budget)
            got += [(line.offset, line.text) for line in new]
        _append(log, content[written:])
        for _ in range(len(content) + 1):  # bounded: a tail that never reaches the end must fail, not hang
            new, offsets = t.read_new(offsets, max_bytes_per_file=_MAX_LINE)
            if not new:
                break
            got += [(line.offset, line.text) for line in new]
    assert got == _reference(content)


# --- rank, node and timestamp of a line ---


@pytest.mark.parametrize(
    ("pattern", "name", "rank", "node"),
    [
        ("logs/job-%j-rank-%t.log", "logs/job-%j-rank-3.log", 3, None),
        ("logs/out-%j-%t.out", "logs/out-%j-12.out", 12, None),  # %t says where the rank is
        ("logs/out-%j-%3t.out", "logs/out-%j-007.out", 7, None),
        ("logs/%N-%t.err", "logs/gpu-node-01-5.err", 5, "gpu-node-01"),
        ("logs/%N.log", "logs/n2.log", None, "n2"),
        ("logs/*.log", "logs/job-5-rank-2.log", 2, None),  # no %t: rank-N in the base name
        ("logs/*.log", "logs/train_rank_4.log", 4, None),
        ("logs/*.log", "logs/rank3.log", 3, None),
        ("logs/*.log", "logs/local_rank0.log", None, None),  # a local rank is not the rank
        ("logs/*.out", "logs/slurm-1234.out", None, None),  # ends in the job id, not a rank
        ("logs/**/*.log", "logs/a/b/rank-1.log", 1, None),
        ("logs/job-%j-batch.log", "logs/job-%j-batch.log", None, None),
    ],
)
def test_rank_and_node_from_the_file_name(
    tmp_path: Path, pattern: str, name: str, rank: int | None, node: str | None
) -> None:
    path = tmp_path / name.replace("%j", "5")
    path.parent.mkdir(parents=True, exist_ok=True)
    _append(path, "hello\n")
    (line,), _ = LogTail(expand_patterns([str(tmp_path / pattern)], 5)).read_new({})
    assert (line.path, line.rank, line.node) == (str(path), rank, node)


@pytest.mark.parametrize(
    ("text", "rank"),
    [
        ("3: Traceback (most recent call last):", 3),  # srun --label
        ('  12:   File "train.py", line 3, in <module>', 12),
        ("[rank5]:[E1130 03:40:01.123 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught", 5),
        ("[default1]:ValueError: bad", None),  # torchrun --tee: a local rank
        ("2026-11-30T03:40:01.123Z [INFO] rank=1/4 node=n1 step=120", 1),
        ("[Rank 3] step=120, skipped=0", 3),
        ("[rank 2] loss=0.1", 2),
        ("rank 6/8 started", 6),
        ("local_rank=0 world_size=4", None),
        ("step=3 rank=", None),
        ("plain text", None),
    ],
)
def test_rank_from_prefix_or_token(tmp_path: Path, text: str, rank: int | None) -> None:
    _append(tmp_path / "all.log", text + "\n")
    (line,), _ = LogTail([str(tmp_path / "all.log")]).read_new({})
    assert line.rank == rank


def test_the_file_name_beats_the_label_which_beats_a_token(tmp_path: Path) -> None:
    _append(tmp_path / "rank-1.log", "2: rank=3 x\n")
    _append(tmp_path / "all.log", "2: rank=3 x\n")
    lines, _ = LogTail([str(tmp_path / "*.log")]).read_new({})
    assert {Path(line.path).name: line.rank for line in lines} == {"all.log": 2, "rank-1.log": 1}
    assert rank_token("[rank1]: rank=2") == 1  # the first token in the line


@pytest.mark.parametrize(
    ("text", "at", "body"),
    [
        ("2026-11-30T03:40:01.123Z [INFO] x", datetime(2026, 11, 30, 3, 40, 1, 123000, UTC), "[INFO] x"),
        ("[2026-11-30 03:40:01,123] INFO x", datetime(2026, 11, 30, 3, 40, 1, 123000, UTC), "INFO x"),
        ("2026-11-30 03:40:01,5 - x", datetime(2026, 11, 30, 3, 40, 1, 500000, UTC), "- x"),
        (
            "2026-11-30T03:40:01.123456789+05:30 x",
            datetime(2026, 11, 30, 3, 40, 1, 123456, timezone(timedelta(hours=5, minutes=30))),
            "x",
        ),  # noqa: E501
        ("2026-11-30T03:40:01-0100 x", datetime(2026, 11, 30, 3, 40, 1, tzinfo=timezone(-timedelta(hours=1))), "x"),
        (" [2024-05-01 10:00:00] iteration 5/9 |", datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC), "iteration 5/9 |"),
        ("1: 2026-11-30T03:40:01Z hi", datetime(2026, 11, 30, 3, 40, 1, tzinfo=UTC), "hi"),
        ("2026-13-45T03:40:01Z not a date", None, "2026-13-45T03:40:01Z not a date"),
        ('  File "x.py", line 1', None, '  File "x.py", line 1'),
        ("ValueError: 2026-11-30T03:40:01Z", None, "ValueError: 2026-11-30T03:40:01Z"),
    ],
)
def test_leading_timestamp(text: str, at: datetime | None, body: str) -> None:
    prefix = split_prefix(text)
    assert (prefix.at, prefix.body) == (at, body)
    if at is not None:
        assert prefix.at is not None and prefix.at.tzinfo is not None


def test_timestamp_lands_on_the_line(tmp_path: Path) -> None:
    _append(
        tmp_path / "rank-0.log", "2026-11-30T03:40:01.123Z [INFO] rank=0/2 step=1\nTraceback (most recent call last):\n"
    )
    lines, _ = LogTail([str(tmp_path / "*.log")]).read_new({})
    assert [line.at for line in lines] == [datetime(2026, 11, 30, 3, 40, 1, 123000, UTC), None]


def test_expand_patterns() -> None:
    assert expand_patterns(["/r/job-%j-rank-%t.log", "/r/%6j.out", "/r/100%%-%j-%N.log"], 42) == [
        "/r/job-42-rank-%t.log",
        "/r/000042.out",
        "/r/100%%-42-%N.log",
    ]


def _array_task(job_id: int, master: int, index: int, **fields: object) -> SlurmJob:
    return SlurmJob.model_validate(
        {"job_id": job_id, "state": JobState.RUNNING, "array_job_id": master, "array_task_id": index, **fields}
    )


def test_array_placeholders_resolve_to_the_tasks_own_values(tmp_path: Path) -> None:
    task = _array_task(8, 1, 0, name="sweep", user="ana")
    assert expand_patterns(["/r/%A_%a.out", "/r/%j-%4a-%x-%u-%t.log"], 8, task) == [
        "/r/1_0.out",
        "/r/8-0000-sweep-ana-%t.log",
    ]
    # Siblings' files are not read: each task reads its own.
    for name in ("train-1_0.log", "train-1_1.log", "train-1_2.log"):
        _append(tmp_path / name, f"{name}\n")
    lines, _ = LogTail(expand_patterns([str(tmp_path / "train-%A_%a.log")], 8, task)).read_new({})
    assert _texts(lines) == ["train-1_0.log"]


def test_placeholders_of_a_job_that_is_not_an_array_task() -> None:
    job = SlurmJob(job_id=42, state=JobState.RUNNING, name="a/../b", user="x*y%z")
    # %A is the job's own id, as in Slurm; %a has no value (matches like *); a name that would change the path's
    # shape is not filled in; glob characters and % in a name are literal text.
    assert expand_patterns(["/r/%A-%a-%x-%u.log"], 42, job) == ["/r/42-%a-%x-x[*]y%%z.log"]
    assert expand_patterns(["/r/%A-%x.log"], 42) == ["/r/42-%x.log"]  # the job unknown: %j and %A only


def test_percent_literal_and_unknown_placeholders(tmp_path: Path) -> None:
    _append(tmp_path / "100%-5-x.log", "a\n")
    _append(tmp_path / "step-7-rank-1.log", "b\n")
    t = LogTail([str(tmp_path / "100%%-%j-x.log"), str(tmp_path / "step-%s-rank-%t.log")])
    lines, _ = t.read_new({})
    assert [(Path(line.path).name, line.rank) for line in lines] == [("100%-5-x.log", None), ("step-7-rank-1.log", 1)]
    assert t.patterns == (str(tmp_path / "100%%-%j-x.log"), str(tmp_path / "step-%s-rank-%t.log"))
    assert t.paths() == [line.path for line in lines]


def test_public_api() -> None:
    assert sorted(tail.__all__) == list(tail.__all__)
    for name in tail.__all__:
        assert hasattr(tail, name), name


@pytest.mark.parametrize(
    ("text", "rank", "task", "rank_is_task"),
    [
        # torchrun under srun --label: the label is the Slurm task (the node's index), [rankN]: the global rank
        ("1: [rank2]: RuntimeError: CUDA error: an illegal memory access was encountered", 2, 1, False),
        ("0: [rank1]: step=5", 1, 0, False),
        # srun per rank: the label is all there is, and it is the rank only when one task runs per rank
        ("3: Traceback (most recent call last):", 3, 3, True),
        ("2: rank=3 x", 2, 2, True),
        # no label: no task
        ("[rank5]: x", 5, None, False),
        ("rank=4 x", 4, None, False),
    ],
)
def test_the_srun_label_is_the_task_and_the_torch_prefix_the_rank(
    tmp_path: Path, text: str, rank: int, task: int | None, rank_is_task: bool
) -> None:
    _append(tmp_path / "slurm-5.out", text + "\n")
    (line,), _ = LogTail([str(tmp_path / "slurm-5.out")]).read_new({})
    assert (line.rank, line.task, line.rank_is_task) == (rank, task, rank_is_task)


def test_a_rank_from_the_file_name_is_no_task_rank(tmp_path: Path) -> None:
    _append(tmp_path / "rank-1.log", "2: x\n")
    (line,), _ = LogTail([str(tmp_path / "rank-*.log")]).read_new({})
    assert (line.rank, line.task, line.rank_is_task) == (1, 2, False)
