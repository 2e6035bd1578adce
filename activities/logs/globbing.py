"""Bounded globbing for log patterns: ``glob.glob(recursive=True)`` that stops at a budget of directory entries
and does not walk below symlinked directories (two links to ``.`` would otherwise make the walk exponential)."""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable

from activities.logs.access import LogAccess
from activities.logs.patterns import LogPattern, superseded
from workflows.domain.bounds import DEFAULT_GLOB_ENTRIES, MAX_GLOB_ENTRIES  # the per-job bounds live in one place

__all__ = ["DEFAULT_GLOB_ENTRIES", "MAX_GLOB_ENTRIES", "GlobBudget", "bounded_glob", "expand_within"]


class GlobBudget:
    """How much more one call's globbing may look at; ``exhausted`` says why it stopped, once it has.

    Args:
        entries: Directory entries the call may visit (``logs.glob_max_entries``), at most ``MAX_GLOB_ENTRIES``.
    """

    def __init__(self, entries: int = DEFAULT_GLOB_ENTRIES) -> None:
        self.limit = max(1, min(entries, MAX_GLOB_ENTRIES))
        self.entries = self.limit
        self.exhausted: str | None = None
        self.overran = False
        """The entries ran out (not the file cap): the pattern being expanded then walked too much."""

    def listdir(self, directory: str) -> list[os.DirEntry[str]]:
        """The entries of ``directory`` (nothing if it cannot be listed), counted against the budget."""
        out: list[os.DirEntry[str]] = []
        if self.exhausted:
            return out
        self.entries -= 1
        try:
            with os.scandir(directory or ".") as it:
                for entry in it:
                    if self.entries <= 0:
                        self.overran = True
                        self.exhausted = (
                            f"the patterns reach more than {self.limit} directory entries (logs.glob_max_entries): "
                            "refused until the job's next attempt; name the files more narrowly"
                        )
                        break
                    self.entries -= 1
                    out.append(entry)
        except (OSError, ValueError):
            pass
        return out


def bounded_glob(pattern: str, budget: GlobBudget) -> list[str]:
    """``glob.glob(pattern, recursive=True)``, within ``budget``, and with ``**`` not following symlinks.

    Like glob: ``*``/``?``/``[...]`` never match a leading ``.``; ``**`` as a whole component matches any number
    of directories. Unlike glob, ``**`` looks into a symlinked directory but does not walk below it.
    """
    parts = pattern.split("/")
    current = ["/"] if pattern.startswith("/") else [""]
    parts = [p for p in parts if p]
    if not parts:
        return []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found: list[str] = []
        for directory in current:
            if part == "**":
                found += _descend(directory, budget, files=last)
            elif glob.has_magic(part):
                hidden_ok = part.startswith(".")
                for entry in budget.listdir(directory):
                    if entry.name.startswith(".") and not hidden_ok:
                        continue
                    if fnmatch.fnmatchcase(entry.name, part) and (last or _is_dir(entry)):
                        found.append(os.path.join(directory, entry.name))
            else:
                path = os.path.join(directory, part)
                if os.path.lexists(path) if last else os.path.isdir(path):
                    found.append(path)
            if budget.exhausted:
                break
        current = found
        if not current or (budget.exhausted and not last):
            return []  # a cut-off walk's directories are not matches
    return current


def expand_within(
    patterns: Iterable[LogPattern],
    access: LogAccess | None,
    *,
    entries: int,
    max_files: int,
    overran: dict[str, str],
) -> tuple[dict[str, LogPattern], dict[str, str]]:
    """The files ``patterns`` match (path -> the first pattern naming it) and what was refused (pattern -> why).

    One ``GlobBudget`` of ``entries`` for all the patterns; at most ``max_files`` files. A pattern the access policy
    refuses is not listed at all. A pattern whose walk runs out of entries is refused whole (a partial walk's files
    are an accident of directory order) and recorded in ``overran`` (the caller's, kept across calls), so it is
    never walked again; the patterns after it are refused for this call only.
    """
    found: dict[str, LogPattern] = {}
    refused: dict[str, str] = {}
    budget = GlobBudget(entries)
    for pattern in patterns:
        reason = access.check_pattern(pattern.glob) if access is not None else None
        if reason is None:
            reason = overran.get(pattern.source) or budget.exhausted
        if reason is not None:
            refused[pattern.source] = reason
            continue
        matched = bounded_glob(pattern.glob, budget)
        if budget.overran:
            overran[pattern.source] = refused[pattern.source] = budget.exhausted or ""
            continue
        for path in matched:
            if path not in found and len(found) >= max_files:
                budget.exhausted = f"more than {max_files} files match (logs.max_files); the others are not read"
                break
            found.setdefault(path, pattern)  # the first pattern that names a file says what it is
        if budget.exhausted:
            refused[pattern.source] = budget.exhausted
    for path in superseded(found):
        del found[path]  # an older torchrun attempt's files: not refused, just not this attempt's
    return found, refused


def _descend(top: str, budget: GlobBudget, *, files: bool) -> list[str]:
    """``top`` and every non-hidden directory below it (and files, with ``files``), not walking symlinks."""
    out = [top]  # "" is the current directory of a relative pattern: os.path.join("", name) is name
    stack = [top]
    while stack and not budget.exhausted:
        directory = stack.pop()
        for entry in budget.listdir(directory):
            if entry.name.startswith("."):
                continue
            path = os.path.join(directory, entry.name)
            if _is_dir(entry):
                out.append(path)
                if not entry.is_symlink():
                    stack.append(path)
            elif files:
                out.append(path)
    return out


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
