"""py-spy output parsing, error summaries, bounds and the binary search, without running py-spy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.procs.pyspy import (
    dump_argv,
    error_summary,
    find_py_spy,
    parse_dump,
    parse_text_dump,
    run_py_spy,
    truncate,
)
from workflows.domain.procs import MAX_MAIN_FRAMES


def frame(name: str, short: str, line: int) -> dict[str, Any]:
    return {"name": name, "filename": f"/abs/{short}", "short_filename": short, "line": line, "locals": None}


# The shape py-spy 0.4.3 prints for ``dump --json`` (captured here, trimmed): worker thread listed first.
DUMP = [
    {
        "pid": 4242,
        "thread_id": 140586189309632,
        "thread_name": "worker-bg",
        "os_thread_id": 4244,
        "active": False,
        "owns_gil": False,
        "frames": [frame("bg", "spytest.py", 5), frame("Thread.run", "threading.py", 982)],
    },
    {
        "pid": 4242,
        "thread_id": 140586202180480,
        "thread_name": "MainThread",
        "os_thread_id": 4242,
        "active": True,
        "owns_gil": True,
        "frames": [frame("wait_for_all_reduce", "spytest.py", 3), frame("<module>", "spytest.py", 7)],
    },
]

TEXT_DUMP = """Process 4242: python spytest.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4244 (idle): "worker-bg"
    bg (spytest.py:5)
Thread 4242 (active+gil): "MainThread"
    wait_for_all_reduce (spytest.py:3)
    <module> (spytest.py:7)
"""

STDERR = """Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: No such file or directory (os error 2)

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_process_info::PythonProcessInfo::new
"""


def test_json_dump_puts_the_main_thread_first() -> None:
    parsed = parse_dump(json.dumps(DUMP), 4242)
    assert parsed.main_frames == ("wait_for_all_reduce (spytest.py:3)", "<module> (spytest.py:7)")
    assert parsed.text.splitlines() == [
        'Thread 4242 (active+gil): "MainThread"',
        "    wait_for_all_reduce (spytest.py:3)",
        "    <module> (spytest.py:7)",
        'Thread 4244 (idle): "worker-bg"',
        "    bg (spytest.py:5)",
        "    Thread.run (threading.py:982)",
    ]


def test_json_dump_without_a_main_thread_has_no_main_frames() -> None:
    parsed = parse_dump(json.dumps(DUMP[:1]), 4242)
    assert parsed.main_frames == () and "bg (spytest.py:5)" in parsed.text


def test_json_native_frames_without_line() -> None:
    thread = dict(DUMP[1], frames=[{"name": "0x7f00aa", "short_filename": "libc.so.6", "line": 0}])
    assert parse_dump(json.dumps([thread]), 4242).main_frames == ("0x7f00aa (libc.so.6)",)


def test_deep_stacks_are_bounded() -> None:
    thread = dict(DUMP[1], frames=[frame("recurse", "r.py", i) for i in range(MAX_MAIN_FRAMES + 50)])
    assert len(parse_dump(json.dumps([thread]), 4242).main_frames) == MAX_MAIN_FRAMES


def test_text_dump_fallback() -> None:
    parsed = parse_dump(TEXT_DUMP, 4242)
    assert parsed.main_frames == ("wait_for_all_reduce (spytest.py:3)", "<module> (spytest.py:7)")
    assert parsed.text == TEXT_DUMP.strip()
    assert parse_text_dump(TEXT_DUMP.replace('"MainThread"', '"other"'), 4242).main_frames[0].startswith("wait")


@pytest.mark.parametrize("out", ["", "Error: nope", '{"not": "a list"}', "[1, 2]"])
def test_unparseable_output_raises_value_error(out: str) -> None:
    with pytest.raises(ValueError):
        parse_dump(out, 1)


def test_error_summary_drops_the_backtrace() -> None:
    assert error_summary(STDERR) == (
        "Error: Failed to get process executable name. Check that the process is running.; "
        "0: No such file or directory (os error 2)"
    )
    assert error_summary("") == "py-spy failed without a message"
    assert len(error_summary("x" * 5000)) <= 600


@pytest.mark.parametrize("limit", [40, 41, 100, 999])
def test_truncate_respects_the_limit_and_says_so(limit: int) -> None:
    text = "y" * 5000
    cut = truncate(text, limit)
    assert len(cut) <= limit and cut.endswith("more chars cut]")
    assert int(cut.rsplit("[", 1)[1].split()[0]) == 5000 - cut.index("\n")
    assert truncate("short", 10) == "short"
    assert truncate(text, 5) == "yyyyy"


def test_dump_argv_is_a_list_without_a_shell() -> None:
    assert dump_argv(Path("/x/py-spy"), 7, native=False, nonblocking=False) == [
        "/x/py-spy",
        "dump",
        "--pid",
        "7",
        "--json",
    ]
    assert dump_argv(Path("p"), 7, native=True, nonblocking=True)[-2:] == ["--native", "--nonblocking"]


def test_find_py_spy_prefers_setting_then_beside_python_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = tmp_path / "custom" / "py-spy"
    assert find_py_spy(configured) == configured  # taken as is: a wrong setting must show up as an error
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "py-spy").write_text("#!/bin/sh\n")
    (on_path / "py-spy").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    assert find_py_spy() == on_path / "py-spy"
    (venv_bin / "py-spy").write_text("#!/bin/sh\n")
    assert find_py_spy() == venv_bin / "py-spy"
    (venv_bin / "py-spy").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_py_spy() is None


async def test_run_reports_missing_binary_and_timeout(tmp_path: Path) -> None:
    missing = await run_py_spy([str(tmp_path / "nope"), "dump"], 5)
    assert missing.missing and "cannot run" in missing.stderr
    slow = tmp_path / "slow"
    slow.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 30\n")
    slow.chmod(0o755)
    timed_out = await run_py_spy([str(slow)], 0.3)
    assert timed_out.timed_out and timed_out.returncode is None
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left behind
        os.kill(int((tmp_path / "pid").read_text()), 0)
