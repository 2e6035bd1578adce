"""Whatever a job prints, the line readers answer, and in time linear in the line.

The readers are ``split_prefix``/``rank_token`` (tail), ``parse_step``/``parse_checkpoint``/``find_progress``
(progress) and ``scan`` (crash, through its public entry point only). Lines come from arbitrary text, from
arbitrary bytes decoded as ``LogTail`` decodes them, and from log-like fragments repeated into long lines, the
shape that makes a regex backtrack (two ``\\s*`` around an optional ``[:=]`` took hours on a 1 MiB line).
"""

from __future__ import annotations

import time
from datetime import UTC, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.logs.crash import scan
from activities.logs.line import LogLine, decode, decode_line, rank_token, split_prefix, to_model
from activities.logs.patterns import LogPattern, expand_patterns
from activities.logs.progress import find_progress, parse_checkpoint, parse_step
from activities.logs.tail import LogTail
from activities.logs.terminal import strip_terminal_codes

# What log lines are made of: the words the readers look for, the separators around them, digits.
FRAGMENTS = [
    "step", "step=", "step:", "Step ", "global_step", "iteration", "iter", "epoch", "Epoch 0:", "%|", "|", "/",
    "rank", "rank=", "[rank", "]", "[", "<", ",", ":", "=", "(", ")", " ", "  ", "\t", "0", "1", "42", "9" * 30,
    "time", "ms", "s/it", "it/s", "checkpoint", "loaded", "loading", "resumed from", "from", "at", "Traceback",
    "Error:", "RuntimeError", "srun: error:", "task", "tasks 0-3", "exit code", "signal", "Killed", "Xid",
    "NVRM", "NCCL", "CUDA error", "Segmentation fault", "slurmstepd", "node=", "n1", "CANCELLED AT", "2026-11-30",
    "T03:40:01", ".123", "Z", "+05:30", "0x", "é", "\ufffd", "\x00", "🏖", "'", '"', ";", "-", ".", "_",
]  # fmt: skip

_ZONES = st.one_of(st.none(), st.just(UTC), st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-900, 900)))
TIMES = st.one_of(st.none(), st.datetimes(timezones=_ZONES))  # naive ones too: LogLine makes them UTC
DECODED = st.binary(max_size=300).map(lambda b: b.decode("utf-8", errors="replace"))
TEXT = st.one_of(st.text(max_size=300), DECODED, st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))


@st.composite
def log_lines(draw: st.DrawFn) -> LogLine:
    return LogLine(
        path=draw(st.sampled_from(["/l/rank-0.log", "/l/rank-1.log", "/l/all.log"])),
        rank=draw(st.one_of(st.none(), st.integers(0, 4096))),
        text=draw(TEXT),
        offset=draw(st.integers(0, 1 << 40)),
        at=draw(TIMES),
        node=draw(st.one_of(st.none(), st.just("n1"))),
    )


@settings(max_examples=400, deadline=None)
@given(text=TEXT, parse_time=st.booleans())
def test_split_prefix_and_rank_token_take_any_text(text: str, parse_time: bool) -> None:
    prefix = split_prefix(text, parse_time=parse_time)
    assert text.endswith(prefix.body)
    assert prefix.at is None or (parse_time and prefix.at.tzinfo is not None)
    for number in (prefix.label, prefix.torch_rank, rank_token(text)):
        assert number is None or 0 <= number < 10**9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(log_lines(), max_size=30))
def test_progress_and_crash_readers_never_raise(lines: list[LogLine]) -> None:
    for line in lines:
        assert line.at is None or line.at.tzinfo is not None
        step = parse_step(line)
        if step is not None:
            assert 0 <= step.step < 10**18 and len(step.text) <= 300
        checkpoint = parse_checkpoint(line)
        assert checkpoint is None or checkpoint.step is None or 0 <= checkpoint.step < 10**18
    found = find_progress(lines)  # compares timestamps across lines: naive and aware ones mixed in
    assert found is None or found.step is None or found.step >= 0
    for finding in scan(lines):
        assert finding.path in {line.path for line in lines}


@pytest.mark.parametrize("digits", [19, 4301, 10_000])
def test_absurd_numbers_are_no_step_rank_or_crash(digits: int) -> None:
    number = "7" * digits
    for text in (f"step={number}", f"iteration {number}/{number} |", f"global_step {number}", f"rank={number} x"):
        line = LogLine(path="/l/a.log", rank=None, text=text, offset=0)
        assert parse_step(line) is None
        assert rank_token(text) is None
        scan([line])
    mark = parse_step(LogLine(path="/l/a.log", rank=None, text=f"step=5/{number} epoch={number}", offset=0))
    assert mark is not None and (mark.step, mark.total, mark.epoch) == (5, None, None)
    checkpoint = parse_checkpoint(
        LogLine(path="/l/a.log", rank=None, text=f"loaded checkpoint x step {number}", offset=0)
    )
    assert checkpoint is not None and checkpoint.step is None


# 256 KiB a line: the readers take well under 0.3 s for it (measured, 2 slow CPUs); a quadratic regex takes
# minutes. The bound leaves a wide margin for a loaded machine.
_LONG = 1 << 18
_PER_LINE_S = 3.0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.sampled_from(FRAGMENTS), unit=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3))
def test_long_lines_of_repeated_fragments_take_linear_time(head: str, unit: list[str]) -> None:
    piece = "".join(unit)
    text = head + piece * (_LONG // len(piece)) + "!"
    line = LogLine(path="/l/a.log", rank=0, text=text, offset=0)
    started = time.perf_counter()
    split_prefix(text)
    rank_token(text)
    parse_step(line)
    parse_checkpoint(line)
    find_progress([line])
    elapsed = time.perf_counter() - started
    assert elapsed < _PER_LINE_S, f"{elapsed:.1f} s for {head!r} + {piece!r} * {_LONG // len(piece)}"


@pytest.mark.parametrize(
    "text",
    [
        "step" + " " * _LONG,
        "global_step" + "\t" * _LONG + "x",
        "iter 5 time" + " " * _LONG,  # a step-time rule had the same shape
        "Epoch 0: 1%|" + "[" + "<" * _LONG,  # and the bar rate its own quadratic
        " 10%|" + "[<," * (_LONG // 3),
        "epoch" + " " * _LONG + "x",
        "loaded checkpoint step" + " " * _LONG,
    ],
)
def test_known_backtracking_shapes_are_linear(text: str) -> None:
    line = LogLine(path="/l/a.log", rank=0, text=text, offset=0)
    started = time.perf_counter()
    parse_step(line)
    parse_checkpoint(line)
    assert time.perf_counter() - started < _PER_LINE_S / 3


# ``scan`` (crash.py, being rewritten onto activities/logs/signatures.py) on 8 KiB lines: linear takes about
# 0.005 s, the two quadratic shapes below 0.5-1.2 s (measured), i.e. hours for a 1 MiB line.
_SCAN_LINE = 1 << 13
_QUADRATIC = "quadratic in signatures.py (owned by the crash rewrite): "


@pytest.mark.parametrize(
    ("head", "unit"),
    [
        ("step", " "),
        ("Traceback", " "),
        ("srun: error:", " "),
        ("CUDA error", ":"),
        ("Xid", " "),  # xid_mention's separator was \s*[:=#]?\s* (quadratic), now possessive
        ("task", "1"),  # _EXTRA_PREFIX's host name was [A-Za-z0-9\-]*\d[A-Za-z0-9.\-]* (quadratic), now possessive
    ],
)
def test_scan_takes_linear_time_on_long_lines(head: str, unit: str) -> None:
    line = LogLine(path="/l/a.log", rank=0, text=head + unit * _SCAN_LINE + "!", offset=0)
    started = time.perf_counter()
    scan([line])
    assert time.perf_counter() - started < 0.25


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.sampled_from(FRAGMENTS), unit=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3))
def test_scan_never_backtracks_catastrophically(head: str, unit: list[str]) -> None:
    # 4 KiB: small enough that the known quadratic shapes cost ~0.15 s, so this catches worse than quadratic.
    piece = "".join(unit)
    line = LogLine(path="/l/a.log", rank=0, text=head + piece * (4096 // len(piece)) + "!", offset=0)
    started = time.perf_counter()
    scan([line])
    assert time.perf_counter() - started < 2.0


PATTERN_TEXT = st.lists(
    st.sampled_from(["*", "**", "?", "[", "]", "!", "-", "%t", "%N", "%j", "%3t", "%%", "%", "/", "a", "rank", "."]),
    max_size=20,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(pattern=PATTERN_TEXT, path=st.lists(st.sampled_from(["/", "a", "-", "1", "rank", ".", "x"]), max_size=60))
def test_any_pattern_compiles_and_identifies_any_path_quickly(pattern: str, path: list[str]) -> None:
    compiled = LogPattern(pattern)
    started = time.perf_counter()
    rank, node, _ = compiled.identity("".join(path))
    assert time.perf_counter() - started < 0.5
    assert rank is None or 0 <= rank < 10**9
    assert node is None or "/" not in node


def test_a_file_name_built_to_make_the_pattern_backtrack(tmp_path: Path) -> None:
    # glob matches it (``*`` takes "x"), the rank regex cannot (``%t`` wants digits): a plain translation of
    # the pattern backtracked for seconds at k=4 and grows like 200**k.
    name = "a" * 200 + "-rank-x.log"
    (tmp_path / name).write_text("hello\n")
    pattern = str(tmp_path / ("*a" * 12 + "*-rank-%t.log"))
    started = time.perf_counter()
    (line,), _ = LogTail([pattern]).read_new({})
    assert time.perf_counter() - started < 0.5
    assert (line.text, line.rank) == ("hello", None)


@settings(max_examples=200, deadline=None)
@given(width=st.text(alphabet="0123456789", max_size=6000), job=st.integers(0, 10**12))
def test_expand_patterns_caps_the_padding(width: str, job: int) -> None:
    (out,) = expand_patterns([f"/l/%{width}j.log"], job)
    digits = out.removeprefix("/l/").removesuffix(".log")
    significant = width.lstrip("0")
    wanted = 10 if len(significant) > 2 else min(10, int(significant or 0))  # srun pads to 10 digits at most
    assert int(digits) == job and len(digits) == max(len(str(job)), wanted)


LINE_STARTS = st.sampled_from(
    ["", "3: ", "[rank5]: ", "[default1]:", "2026-11-30T03:40:01.123Z ", "[2026-11-30 03:40:01,123] ",
     "2026-13-45 10:00:00 ", "\x1b[32m2026-11-30 03:40:01\x1b[0m | ", "0: [rank2]: 2026-11-30T03:40:01+02:00 ",
     "\x1b[31m", "  "]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(start=LINE_STARTS, text=TEXT, file_rank=st.one_of(st.none(), st.integers(0, 9)))
def test_a_decoded_line_carries_the_prefix_the_readers_would_peel(start: str, text: str, file_rank: int | None) -> None:
    """``decode`` peels once what the progress and signature readers peel (``Line.prefix``), and ``decode_line``'s
    model holds the same values."""
    raw = (start + text).encode("utf-8", errors="surrogatepass")
    line = decode("/logs/rank-1.log", file_rank, None, 7, raw)
    assert line.prefix == split_prefix(strip_terminal_codes(line.text), parse_time=False)
    model = decode_line("/logs/rank-1.log", file_rank, None, 7, raw)
    assert to_model(line) == model and (model.rank, model.at, model.task) == (line.rank, line.at, line.task)
