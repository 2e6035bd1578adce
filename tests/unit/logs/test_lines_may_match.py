"""``lines_may_match``: a chunk it clears holds no line any row matches (the quiet polls skip such chunks), checked
line by line and chunk by chunk on the repository's test logs and generated lines, through ``match`` and through the
crash reader the watch runs; and it clears the progress lines a healthy job prints, or it would save nothing."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs import crash
from activities.logs.crash import to_findings
from activities.logs.job_watcher import suspect_lines
from activities.logs.line import decode
from activities.logs.signatures import lines_may_match, match, prepare
from activities.logs.tail import LogTail
from deploy.scale.logwriter import crash_lines, step_line
from tests.unit.logs.line_corpus import corpus_files, corpus_lines, generated_lines, generated_logs


def _findings(lines: list[str]) -> list[crash.CrashFinding]:
    return crash.scan([decode("/l/rank-0.log", None, None, i, line.encode()) for i, line in enumerate(lines)])


def test_a_cleared_line_matches_no_row() -> None:
    lines = [*corpus_lines(), *generated_lines()]
    cleared = [line for line in lines if not lines_may_match(line)]
    assert len(cleared) > 1000  # the test means something: many lines are cleared
    assert [line for line in cleared if match(prepare(line).body) is not None] == []
    assert _findings(cleared) == []


def test_a_cleared_chunk_gives_the_crash_reader_nothing() -> None:
    lines = [*corpus_lines(), *generated_lines()]
    rng = random.Random(3)
    checked = 0
    for _ in range(3000):
        start = rng.randrange(len(lines))
        chunk = lines[start : start + rng.randrange(1, 12)]
        end = rng.choice(("\n", "\r", "\r\n"))
        if not lines_may_match(end.join(chunk) + end):
            checked += 1
            assert _findings(chunk) == [], chunk
    assert checked > 300


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(min_codepoint=9, max_codepoint=126), max_size=80), max_size=6))
def test_random_ascii_lines(lines: list[str]) -> None:
    text = "\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines)
    if not lines_may_match(text):
        assert _findings(text.split("\n")) == []


def test_progress_is_cleared_and_failures_are_not() -> None:
    steps = "".join(step_line(r, 8, "g00001", 1200 + r, 1796680000.0 + r) for r in range(8))
    assert not lines_may_match(steps)
    assert lines_may_match(steps + crash_lines(3, 8, "g00001", 1796680009.0))
    assert lines_may_match(steps + "[INFO] step=9 loss=nan\n")
    assert lines_may_match("caf\u00e9 step=1\n")  # non-ASCII: not cleared
    assert lines_may_match("\x1b[31mstep=1\x1b[0m\n")  # terminal codes: not cleared


def test_scanning_only_the_suspect_files_finds_what_scanning_all_finds(tmp_path: Path) -> None:
    """The watch scans only the files whose new lines may match (``suspect_lines``): the same findings, in the same
    order, as scanning every line, on every test log and on generated logs, read together by one tail."""
    files = [*corpus_files()]
    for i, data in enumerate(generated_logs()):
        path = tmp_path / f"gen-{i}.log"
        path.write_bytes(data)
        files.append(path)
    for start in range(0, len(files), 7):  # several files per read, as a job's ranks are
        group = tmp_path / f"g{start}"
        group.mkdir()
        for n, src in enumerate(files[start : start + 7]):
            (group / f"rank-{n}.log").write_bytes(src.read_bytes())
        lines, _ = LogTail([str(group / "rank-%t.log")]).read_lines({})
        assert to_findings(crash.scan(suspect_lines(lines))) == to_findings(crash.scan(lines))
    assert any(not lines_may_match(line) for line in generated_lines())  # and some files are skipped


def test_a_file_is_scanned_whole_so_a_tracebacks_code_line_keeps_its_context(tmp_path: Path) -> None:
    """A traceback's ``File`` line holds no signature text, its code line does: the code line is not a finding
    because of the line before it, so a suspect file is scanned with all its lines, not only the suspect ones."""
    (tmp_path / "rank-0.log").write_text(
        "step=1 loss=0.5\n"
        '  File "/opt/train.py", line 9, in step\n'
        '    raise RuntimeError("CUDA error: an illegal memory access was encountered")\n'
    )
    lines, _ = LogTail([str(tmp_path / "rank-%t.log")]).read_lines({})
    assert crash.scan(lines) == []  # the code line is context, not a crash
    assert crash.scan(suspect_lines(lines)) == []
