"""Running ``py-spy dump`` on one process and turning its output into frames and a bounded text.

py-spy is run with an argument list (never a shell) and its own timeout; a timed-out run is killed, and the
kernel then detaches it from the rank it had paused. The JSON output (``--json``, py-spy >= 0.3.4) is parsed and
rendered as text in py-spy's own layout with the main thread first, so a cut text keeps the thread that matters.
Output that is not JSON (an older py-spy) is kept as text and its main thread's frames are read from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workflows.domain.procs import MAX_MAIN_FRAMES

__all__ = [
    "DumpRun",
    "ParsedDump",
    "dump_argv",
    "error_summary",
    "find_py_spy",
    "parse_dump",
    "parse_text_dump",
    "run_py_spy",
    "truncate",
]

_MAX_ERROR_CHARS = 600
_MARKER_ROOM = 40  # "\n... [N more chars cut]" for any N below 10**20
_TEXT_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<status>[^)]*)\)(?:: "(?P<name>.*)")?\s*$')
_TEXT_FRAME = re.compile(r"^\s{4}(?P<frame>\S.*)$")


@dataclass(frozen=True)
class DumpRun:
    """One py-spy run: its exit status and output, or ``timed_out`` (then it was killed)."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    missing: bool = False
    """The binary could not be started (gone, not executable)."""


@dataclass(frozen=True)
class ParsedDump:
    """A dump as text (main thread first) and the main thread's frames, innermost first."""

    text: str
    main_frames: tuple[str, ...]


def find_py_spy(configured: Path | None = None) -> Path | None:
    """The py-spy binary: ``configured`` if set, else next to this interpreter (a venv's bin), else on PATH."""
    if configured is not None:
        return configured
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return beside
    found = shutil.which("py-spy")
    return Path(found) if found else None


def dump_argv(binary: Path, pid: int, *, native: bool, nonblocking: bool) -> list[str]:
    """The argument list of one dump; ``nonblocking`` reads without pausing (for stopped or D-state ranks)."""
    argv = [str(binary), "dump", "--pid", str(pid), "--json"]
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    return argv


async def run_py_spy(argv: list[str], timeout_s: float) -> DumpRun:
    """Run py-spy, kill it after ``timeout_s``; never raises for a failed or missing binary."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as e:
        return DumpRun(None, "", f"cannot run {argv[0]}: {e}", missing=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        return DumpRun(None, "", "", timed_out=True)
    finally:
        if proc.returncode is None:  # timed out, or the activity was cancelled mid-dump
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
    return DumpRun(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def error_summary(stderr: str) -> str:
    """py-spy's error message and its causes, without the Rust backtrace, on one bounded line."""
    lines: list[str] = []
    for line in stderr.splitlines():
        if line.startswith("Stack backtrace:"):
            break
        line = line.strip()
        if line and line != "Caused by:":
            lines.append(line)
    return truncate("; ".join(lines), _MAX_ERROR_CHARS) or "py-spy failed without a message"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was cut (when there is room to say it)."""
    if len(text) <= limit:
        return text
    if limit < _MARKER_ROOM:
        return text[:limit]
    keep = limit - _MARKER_ROOM
    return text[:keep] + f"\n... [{len(text) - keep} more chars cut]"


def _frame(raw: dict[str, Any]) -> str:
    name = str(raw.get("name") or "?")
    where = str(raw.get("short_filename") or raw.get("filename") or "?")
    line = raw.get("line")
    return f"{name} ({where}:{line})" if isinstance(line, int) and line > 0 else f"{name} ({where})"


def _is_main(thread: dict[str, Any], pid: int) -> bool:
    return thread.get("os_thread_id") == pid or thread.get("thread_name") == "MainThread"


def parse_dump(stdout: str, pid: int) -> ParsedDump:
    """Parse ``py-spy dump --json`` output; falls back to the text layout when it is not JSON.

    Raises:
        ValueError: The output is neither py-spy's JSON nor its text layout with at least one thread.
    """
    try:
        threads = json.loads(stdout)
    except json.JSONDecodeError:
        return parse_text_dump(stdout, pid)
    if not isinstance(threads, list) or not all(isinstance(t, dict) for t in threads):
        raise ValueError("py-spy JSON is not a list of threads")
    # Main thread first: when the text is cut, the other threads go first.
    threads.sort(key=lambda t: not _is_main(t, pid))
    blocks: list[str] = []
    main: tuple[str, ...] = ()
    for i, t in enumerate(threads):
        frames = [_frame(f) for f in t.get("frames") or () if isinstance(f, dict)]
        status = "active" if t.get("active") else "idle"
        if t.get("owns_gil"):
            status += "+gil"
        tid = t.get("os_thread_id") or t.get("thread_id") or "?"
        name = t.get("thread_name")
        header = f"Thread {tid} ({status})" + (f': "{name}"' if name else "")
        blocks.append("\n".join([header, *(f"    {f}" for f in frames)]))
        if i == 0 and _is_main(t, pid):
            main = tuple(frames[:MAX_MAIN_FRAMES])
    return ParsedDump(text="\n".join(blocks), main_frames=main)


def parse_text_dump(stdout: str, pid: int) -> ParsedDump:
    """Read the main thread's frames from py-spy's text layout (``Thread N (idle): "MainThread"`` + frames).

    Raises:
        ValueError: No ``Thread`` header was found.
    """
    main: list[str] = []
    in_main = False
    seen_thread = False
    for line in stdout.splitlines():
        header = _TEXT_THREAD.match(line)
        if header:
            seen_thread = True
            tid = header["tid"]
            in_main = not main and (header["name"] == "MainThread" or (tid.isdigit() and int(tid) == pid))
            continue
        frame = _TEXT_FRAME.match(line)
        if in_main and frame and len(main) < MAX_MAIN_FRAMES:
            main.append(frame["frame"].strip())
    if not seen_thread:
        raise ValueError(f"py-spy output has no thread: {stdout[:120]!r}")
    return ParsedDump(text=stdout.strip(), main_frames=tuple(main))
