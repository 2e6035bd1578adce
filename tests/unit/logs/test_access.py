"""LogAccess: a job makes Rebound read only its own user's files under the configured roots; refusals are reported."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from activities.logs import globbing, patterns, tail
from activities.logs.access import LogAccess
from activities.logs.line import LogLine
from activities.logs.tail import LogTail, positions

ME = os.geteuid()


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """``root/`` (the log root, with ``logs/a.log``) and ``outside/`` (a secret next to it)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "logs").mkdir(parents=True)
    outside.mkdir()
    (root / "logs" / "a.log").write_text("inside\n")
    (outside / "secret.log").write_text("SECRET\n")
    return root, outside


class _Read(NamedTuple):
    lines: list[LogLine]
    offsets: dict[str, int]
    refused: dict[str, str]


def _read(patterns: list[str], access: LogAccess | None, offsets: dict[str, int] | None = None) -> _Read:
    t = LogTail(patterns, access)
    lines, new = t.read_new(offsets or {})
    return _Read(lines, new, t.refused)


def _texts(t: _Read) -> list[str]:
    return [line.text for line in t.lines]


def test_files_under_the_roots_and_owned_by_the_user_are_read(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    t = _read([str(root / "logs" / "*.log")], LogAccess([root], ME))
    assert _texts(t) == ["inside"] and t.refused == {}


def test_a_pattern_outside_the_roots_is_refused_before_globbing(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, outside = tree
    listed: list[str] = []
    real_scandir = os.scandir

    def scandir(path: str = ".") -> Iterator[os.DirEntry[str]]:
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    pattern = str(outside / "*.log")
    t = _read([pattern, str(root / "logs" / "*.log")], LogAccess([root]))
    assert _texts(t) == ["inside"]
    assert "outside the log roots" in t.refused[pattern] and str(outside) in t.refused[pattern]
    assert str(outside) not in listed  # never even listed


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda root, outside: f"{root}/logs/../../outside/*.log", "'..'"),
        (lambda root, outside: "logs/*.log", "not an absolute path"),
        (lambda root, outside: f"{root}/../outside/secret.log", "'..'"),
        (lambda root, outside: f"{root.parent}/*/secret.log", "outside the log roots"),  # would list the parent
        (lambda root, outside: "/*.log", "outside the log roots"),
    ],
)
def test_patterns_that_could_leave_the_roots(tree: tuple[Path, Path], make: object, why: str) -> None:
    root, outside = tree
    pattern = make(root, outside)  # type: ignore[operator]
    t = _read([pattern], LogAccess([root]))
    assert t.lines == [] and why in t.refused[pattern]


def test_a_symlinked_directory_in_the_pattern_is_resolved_before_globbing(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "link").symlink_to(outside)
    pattern = str(root / "link" / "*.log")
    t = _read([pattern], LogAccess([root]))
    assert t.lines == [] and f"resolves to '{outside}'" in t.refused[pattern]


@pytest.mark.parametrize("target", ["file", "dir"])
def test_a_symlink_under_the_root_that_points_outside_is_refused(tree: tuple[Path, Path], target: str) -> None:
    root, outside = tree
    if target == "file":
        (root / "logs" / "b.log").symlink_to(outside / "secret.log")
        pattern, refused = str(root / "logs" / "*.log"), str(root / "logs" / "b.log")
    else:
        (root / "logs" / "sub").symlink_to(outside)
        pattern, refused = str(root / "logs" / "*" / "*.log"), str(root / "logs" / "sub" / "secret.log")
    t = _read([pattern, str(root / "logs" / "a.log")], LogAccess([root], ME))
    assert "SECRET" not in _texts(t) and "inside" in _texts(t)
    assert t.refused[refused].startswith("outside the log roots: it resolves to")
    assert refused not in positions(t.offsets)


def test_a_root_behind_a_symlink_and_symlinks_inside_the_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    alias = root.parent / "alias"
    alias.symlink_to(root)
    (root / "run1").mkdir()
    (root / "run1" / "x.txt").write_text("current\n")
    (root / "logs" / "current.log").symlink_to(root / "run1" / "x.txt")  # inside: fine
    t = _read([str(alias / "logs" / "*.log")], LogAccess([alias], ME))
    assert _texts(t) == ["inside", "current"] and t.refused == {}
    assert LogAccess([alias]).roots == (str(root),)


def test_files_of_another_user_are_refused_also_through_a_hard_link(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    # A hard link is a real file under the root: only its owner gives it away. Every file here is ours (ME), so
    # for a job of user ME + 1 they are all "someone else's".
    os.link(outside / "secret.log", root / "logs" / "hard.log")
    t = _read([str(root / "logs" / "*.log")], LogAccess([root], ME + 1))
    assert t.lines == []
    assert t.refused == {
        str(root / "logs" / name): f"owned by uid {ME}, not by the job's user (uid {ME + 1})"
        for name in ("a.log", "hard.log")
    }


def test_owner_only_without_roots(tree: tuple[Path, Path]) -> None:
    _, outside = tree
    assert _texts(_read([str(outside / "*.log")], LogAccess((), ME))) == ["SECRET"]
    assert _read([str(outside / "*.log")], LogAccess((), ME + 1)).refused  # uid differs


def test_refused_files_keep_their_offsets(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    log = str(root / "logs" / "a.log")
    t = _read([log], LogAccess([root], ME + 1), {log: 3, "\x00crc:" + log: 42})
    assert t.offsets == {log: 3, "\x00crc:" + log: 42}


def test_for_job_fails_closed_without_a_user_id(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    pattern = str(root / "logs" / "*.log")
    closed = _read([pattern], LogAccess.for_job([root], None, require_owner=True))
    assert closed.lines == [] and "user id is unknown" in closed.refused[pattern]
    assert _texts(_read([pattern], LogAccess.for_job([root], None, require_owner=False))) == ["inside"]
    assert LogAccess.for_job([], 1234, require_owner=True).owner_uid == 1234
    assert LogAccess.for_job([], 1234, require_owner=False).owner_uid is None


def test_the_opened_descriptor_is_checked_again(tree: tuple[Path, Path]) -> None:
    """The symlink swapped after the pre-open check: the real path of what was opened is outside."""
    root, outside = tree

    class Raced(LogAccess):
        def check_path(self, path: str) -> str | None:
            return None  # as if the link still pointed inside when it was resolved

    (root / "logs" / "b.log").symlink_to(outside / "secret.log")
    t = _read([str(root / "logs" / "b.l?g")], Raced([root], ME))  # a wildcard: the pattern check sees the dir
    assert t.lines == []
    assert t.refused == {
        str(root / "logs" / "b.log"): f"outside the log roots: it is '{outside / 'secret.log'}' (roots: {root})"
    }


def test_a_symlink_flipping_between_inside_and_outside_never_leaks(tree: tuple[Path, Path]) -> None:
    """A real race: another thread retargets the link as fast as it can while we read it, 300 times."""
    root, outside = tree
    link = root / "logs" / "flip.log"
    inside_target, outside_target = root / "logs" / "a.log", outside / "secret.log"
    link.symlink_to(inside_target)
    stop = threading.Event()

    def flip() -> None:
        tmp = root / "logs" / ".flip.tmp"
        while not stop.is_set():
            for target in (outside_target, inside_target):
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(target)
                tmp.replace(link)  # atomic rename over the link

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    reasons: set[str] = set()
    read = 0
    try:
        for _ in range(300):
            t = LogTail([str(link)], LogAccess([root]))
            lines, _ = t.read_new({})
            assert all(line.text != "SECRET" for line in lines)
            read += bool(lines)
            reasons |= {r.split(":")[0] for r in t.refused.values()}
    finally:
        stop.set()
        flipper.join()
    assert read > 0 and "outside the log roots" in reasons  # both outcomes happened


def test_special_files_are_refused_and_never_opened(tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tree
    logs = root / "logs"
    os.mkfifo(logs / "fifo.log")
    (logs / "null.log").symlink_to("/dev/null")
    (logs / "dir.log").mkdir()
    (logs / "dangling.log").symlink_to(logs / "nowhere")
    (logs / "loop.log").symlink_to(logs / "loop.log")
    opened: list[str] = []
    real_open = os.open

    def record(path: str, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", record)
    t = _read([str(logs / "*.log")], None)
    assert _texts(t) == ["inside"]
    assert opened == [str(logs / "a.log")]
    assert t.refused == {
        str(logs / "fifo.log"): "not a regular file (fifo)",
        str(logs / "null.log"): "not a regular file (character device)",
        str(logs / "dangling.log"): "cannot read: No such file or directory (dangling symlink)",
        str(logs / "loop.log"): "cannot read: Too many levels of symbolic links",
    }  # the directory is skipped without a word: globs match directories


def test_permission_denied_is_reported(tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = tree
    log = root / "logs" / "a.log"
    if ME == 0:  # root reads anything: make the kernel's answer the one an unprivileged worker gets
        real_open = os.open

        def deny(path: str, *args: object, **kwargs: object) -> int:
            if str(path) == str(log):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", deny)
    else:
        log.chmod(0)
    t = _read([str(log)], None, {str(log): 3})
    assert t.lines == [] and t.offsets == {str(log): 3}
    assert t.refused == {str(log): "cannot open: Permission denied"}


def test_glob_limits_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tail, "MAX_FILES", 5)
    for i in range(8):
        (tmp_path / f"r{i}.log").write_text(f"{i}\n")
    pattern = str(tmp_path / "*.log")
    t = _read([pattern, str(tmp_path / "x-*.log")], None)
    assert len(t.lines) == 5
    assert t.refused == {
        pattern: "more than 5 files match (logs.max_files); the others are not read",
        str(tmp_path / "x-*.log"): "more than 5 files match (logs.max_files); the others are not read",
    }

    monkeypatch.setattr(globbing, "MAX_GLOB_ENTRIES", 4)
    t = _read([pattern], None)
    assert "more than 4 directory entries" in t.refused[pattern]


def test_bad_arguments_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        LogAccess(["relative/dir"])
    with pytest.raises(TypeError, match="sequence of directories"):
        LogAccess(str(tmp_path))
    with pytest.raises(TypeError, match="owner_uid"):
        LogAccess([], True)
    with pytest.raises(TypeError, match="owner_uid"):
        LogAccess([], "1000")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        LogAccess([], -1)
    with pytest.raises(TypeError, match="not a single string"):
        LogTail(str(tmp_path / "*.log"))
    with pytest.raises(TypeError, match="must be a str"):
        LogTail([None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="offsets must be a mapping"):
        LogTail([]).read_new([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_bytes_per_file"):
        LogTail([]).read_new({}, max_bytes_per_file=float("inf"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plain job id"):
        patterns.expand_patterns(["/x/%j.log"], "../../etc")
