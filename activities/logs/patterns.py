"""srun-style log file patterns: ``%j`` filled in, the glob that lists the files, the rank and node a name says.

Patterns use srun's filename placeholders (``srun --output``), so the pattern that names the files also says
where the rank is:

* ``%j`` is the job id (``expand_patterns`` fills it in, with srun's zero padding: ``%6j``); for a task of a
  job array that is the task's own id, and ``%A`` (the array's master id) and ``%a`` (the task's index) are
  filled in too, so a task reads its own files and never its siblings'. ``%A`` of a job that is not an array
  task is its id, as in Slurm. ``%x`` (job name) and ``%u`` (user name) are filled in when the job is known
  (a value with a ``/``, or ``.``/``..``, is not: it would change the path's shape);
* ``%t`` (``%3t``) is the task id, i.e. the rank, and ``%N`` the node name: both match like ``*`` and are
  captured;
* every other ``%x``-style placeholder (and one whose value is unknown: ``%a`` of a job that is not an array
  task, ``%x`` of an unknown job) matches like ``*``; ``%%`` is a literal ``%``.

Rank of a file, first rule that gives one (the line's own prefixes come after: ``activities.logs.line``):

1. ``%t`` in the pattern that matched the file (``logs/job-%j-rank-%t.log``);
2. without ``%t``: ``rank-N``, ``rank_N``, ``rank.N`` or ``rankN`` in the file's base name (not ``local_rank``).

A bare ``-N.out`` suffix is deliberately not a rank: ``slurm-1234.out`` ends in the job id.

torchrun's per-worker files (``--log-dir`` with ``--redirects`` or ``--tee``; ``torch.distributed.elastic``'s
``DefaultLogsSpecs``, torch 2.x) are ``<log_dir>/<rdzv_run_id>_<random>/attempt_<restart count>/<local
rank>/{stdout,stderr}.log``. The number there is the worker's *local* rank, the same on every node, never the
job's rank, whatever the pattern calls it (``%t``, ``rank-N``): such a file gives no rank (its lines' own
``[rankN]:`` prefixes do, ``activities.logs.line``), its local rank (``FileIdentity.local_rank``) and its node:
``%N``, else a directory named after one of the job's nodes (``--log-dir logs/$SLURMD_NODENAME``). Placing a
(node, local rank) as a job rank needs the job's process view, not a file name. Of one run directory only the
newest ``attempt_<n>`` counts (torchrun's own restarts number them; ``superseded``), and its
``filtered_{stdout,stderr}.log`` (copies of some ranks' output) is not read when the per-rank files are.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from collections.abc import Collection, Iterable
from typing import NamedTuple

from activities.logs.line import MAX_RANK_DIGITS
from workflows.domain.slurm import SlurmJob

__all__ = ["FileIdentity", "LogPattern", "expand_patterns", "superseded", "torchrun_local_rank"]

# srun: "if a value greater than 10 is used the result is padding up to 10 characters".
_MAX_PAD = 10
_JOB_ID = re.compile(r"[0-9A-Za-z_]+")

_PLACEHOLDER = re.compile(r"%%|%(\d*)([A-Za-z])")
# torchrun's layout (module docstring): the run directory, the attempt and the local rank of a worker's file.
_TORCHRUN_FILE = re.compile(
    r"^(?P<run>.*)/attempt_(?P<attempt>\d{1,9})/(?:(?P<local>\d{1,9})/|filtered_)std(?:out|err)\.log$"
)
_NAME_RANK = re.compile(r"(?<![a-z])(?<!local_)(?<!local-)rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)


def expand_patterns(patterns: Iterable[str], job_id: int | str, job: SlurmJob | None = None) -> list[str]:
    """Fill in the job's own placeholders: ``%j``, and with ``job`` known ``%A``, ``%a``, ``%x``, ``%u``.

    Args:
        patterns: srun-style output patterns, e.g. ``/runs/x/logs/job-%j-rank-%t.log``.
        job_id: The Slurm job id (an array task's own id).
        job: The job as the scheduler lists it, for the array ids, its name and user; None fills ``%j`` (and
            ``%A`` as the job id) only.

    Returns:
        The patterns, in order, with the job's values filled in (numbers with srun's zero padding, capped at 10
        digits as srun caps it; names with glob characters escaped). ``%%`` is kept, so ``LogTail`` still reads it
        as a literal ``%``; so are the per-task placeholders (``%t``, ``%N``) and those without a value.

    Raises:
        ValueError: ``job_id`` is not a plain id (letters, digits, ``_``): it must not add path components.
    """
    job_text = str(job_id)
    if isinstance(job_id, bool) or not _JOB_ID.fullmatch(job_text):
        raise ValueError(f"job_id must be a plain job id, got {job_id!r:.80}")
    numbers: dict[str, str] = {"j": job_text, "A": job_text}
    names: dict[str, str] = {}
    if job is not None:
        if job.array_job_id is not None and job.array_task_id is not None:
            numbers["A"], numbers["a"] = str(job.array_job_id), str(job.array_task_id)
        names = {code: _path_safe(value) for code, value in (("x", job.name), ("u", job.user)) if _fits(value)}

    def substitute(m: re.Match[str]) -> str:
        code = m.group(2)
        if m.group(0) == "%%":
            return m.group(0)
        if code in numbers:
            width = m.group(1).lstrip("0")
            return numbers[code].zfill(_MAX_PAD if len(width) > 2 else min(int(width or 0), _MAX_PAD))
        return names.get(code, m.group(0))

    return [_PLACEHOLDER.sub(substitute, p) for p in patterns]


class FileIdentity(NamedTuple):
    """What a log file's path says about whose lines it holds (module docstring); any of it may be None."""

    rank: int | None
    node: str | None
    local_rank: int | None = None
    """The worker's local rank on its node (torchrun's per-worker files); ``rank`` is None then."""


def torchrun_local_rank(path: str) -> int | None:
    """The local rank of a torchrun per-worker file (``.../attempt_0/3/stderr.log``: 3), else None."""
    m = _TORCHRUN_FILE.match(path)
    return int(m.group("local")) if m and m.group("local") is not None else None


def superseded(paths: Iterable[str]) -> set[str]:
    """The torchrun files among ``paths`` that do not count (module docstring): those of an attempt older than
    the newest of their run directory, and an attempt's ``filtered_*.log`` copies when its per-rank files match."""
    runs: list[tuple[str, str, int, bool]] = []
    newest: dict[str, int] = {}
    per_rank: set[tuple[str, int]] = set()
    for path in paths:
        m = _TORCHRUN_FILE.match(path)
        if m is None:
            continue
        run, attempt, is_rank = m.group("run"), int(m.group("attempt")), m.group("local") is not None
        runs.append((path, run, attempt, is_rank))
        newest[run] = max(newest.get(run, attempt), attempt)
        if is_rank:
            per_rank.add((run, attempt))
    return {
        path
        for path, run, attempt, is_rank in runs
        if attempt < newest[run] or (not is_rank and (run, attempt) in per_rank)
    }


def _fits(value: str) -> bool:
    """Whether a job name or user name can stand in one path component as it is."""
    return bool(value) and "/" not in value and "\0" not in value and value not in (".", "..")


def _path_safe(value: str) -> str:
    """``value`` as literal text of a pattern: glob characters escaped, ``%`` doubled."""
    return glob.escape(value).replace("%", "%%")


class LogPattern:
    """One glob pattern with srun placeholders: the glob to list files, the regex to read rank and node back.

    The regex exists only when the pattern captures something (``%t``, ``%N``), and matching it takes
    polynomial time whatever the pattern, which a job owner writes: a plain translation of ``*a*a*a*a``
    backtracks exponentially on a file name that does not fit it (seconds for 200 characters, measured).
    So, as in glob, each path component is matched on its own: the components before the first ``**`` and
    after the last one are aligned with the path's first and last components, whatever lies between is
    skipped (a capture there is not used), and inside a component a ``*`` followed by literal text and
    another wildcard commits to the literal's first occurrence (an atomic group, as ``fnmatch`` does; a ``*``
    cannot cross a ``/``, so a later occurrence could not match where the first one fails).
    """

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"a log pattern must be a str, got {type(pattern).__name__}: {pattern!r:.80}")
        self.source = pattern
        components = pattern.split("/")
        deep = [i for i, c in enumerate(components) if c == "**"]
        seen: set[str] = set()
        globs: list[str] = []
        regexes: list[str] = []
        for i, component in enumerate(components):
            between = bool(deep) and deep[0] <= i <= deep[-1]
            glob_text, regex = _component(component, None if between else seen)
            globs.append(glob_text)
            regexes.append(regex)
        self.glob = "/".join(globs)
        self.has_rank = "rank" in seen
        if not deep:
            full = "/".join(regexes)
        else:
            head, tail = "/".join(regexes[: deep[0]]), "/".join(regexes[deep[-1] + 1 :])
            if deep[0] == 0:
                full = f"(?:.*/)?{tail}" if deep[-1] + 1 < len(regexes) else ".*"
            else:
                full = head + (f"(?:/.*)?/{tail}" if deep[-1] + 1 < len(regexes) else "(?:/.*)?")
        self.regex: re.Pattern[str] | None = None
        if seen:
            with contextlib.suppress(re.error):  # e.g. a reversed range "[z-a]": the file name must tell then
                self.regex = re.compile(full, re.DOTALL)

    def identity(self, path: str, hosts: Collection[str] = ()) -> FileIdentity:
        """Rank, node and local rank of ``path`` by the rules in the module docstring; any may be None.

        ``hosts``: the job's nodes, for a torchrun file in a directory named after its node.
        """
        m = self.regex.fullmatch(path) if self.regex is not None else None
        groups = m.groupdict() if m else {}
        node = groups.get("node") or None
        local_rank = torchrun_local_rank(path)
        if local_rank is not None:
            named = {part for part in path.split("/") if part in hosts}
            return FileIdentity(None, node or (named.pop() if len(named) == 1 else None), local_rank)
        digits = groups.get("rank")
        rank = int(digits) if digits and len(digits) <= MAX_RANK_DIGITS else None
        if rank is None and not self.has_rank:
            found = _NAME_RANK.search(os.path.basename(path))
            rank = int(found.group(1)) if found and len(found.group(1)) <= MAX_RANK_DIGITS else None
        return FileIdentity(rank, node)


def _component(component: str, seen: set[str] | None) -> tuple[str, str]:
    """The glob and the regex of one path component of a pattern.

    Args:
        component: The text between two ``/``, srun placeholders and all.
        seen: The captures made so far (updated); None where nothing may be captured (placeholders match
            like ``*``).
    """
    if component == "**":
        return "**", ".*"
    glob_parts: list[str] = []
    tokens: list[tuple[str, str]] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(component):
        glob_parts.append(component[pos : m.start()])
        tokens += _glob_tokens(component[pos : m.start()])
        pos = m.end()
        if m.group(0) == "%%":
            glob_parts.append("%")
            tokens.append(("lit", "%"))
            continue
        glob_parts.append("*")
        # A rank is a run of digits taken whole (possessive: nothing to backtrack into).
        group = {"t": ("rank", r"\d++"), "N": ("node", r"[^/]+?")}.get(m.group(2)) if seen is not None else None
        if group is None or seen is None:
            tokens.append(("star", ""))
        elif group[0] in seen:
            tokens.append(("lit", f"(?P={group[0]})"))  # fixed text once captured
        else:
            seen.add(group[0])
            tokens.append(("cap", f"(?P<{group[0]}>{group[1]})"))
    glob_parts.append(component[pos:])
    tokens += _glob_tokens(component[pos:])
    return "".join(glob_parts), _assemble(tokens)


def _glob_tokens(text: str) -> list[tuple[str, str]]:
    """Regex tokens for the glob syntax in ``text`` (one path component): ``star`` for ``*`` (and ``**`` inside
    a component, as glob reads it), fixed-width ``lit`` tokens for characters, ``?`` and ``[...]`` sets."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            if not out or out[-1][0] != "star":
                out.append(("star", ""))
        elif ch == "?":
            out.append(("lit", r"[^/]"))
        elif ch == "[":
            j = i + 1
            if j < len(text) and text[j] == "!":
                j += 1
            if j < len(text) and text[j] == "]":
                j += 1
            j = text.find("]", j)
            if j < 0:
                out.append(("lit", re.escape(ch)))
            else:
                out.append(("lit", _char_set(text[i + 1 : j])))
                i = j
        else:
            out.append(("lit", re.escape(ch)))
        i += 1
    return out


def _char_set(body: str) -> str:
    """A glob ``[...]`` body as a regex set: ``!`` negates, ``-`` makes ranges, everything else is literal."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    chars = "".join("\\" + c if c in "\\^[]&~|" else c for c in body)
    chars = re.sub(r"-{2,}", lambda m: "\\-" * len(m.group()), chars)  # "--" would be a set operation
    return "[^/" + chars + "]" if negate else "[" + chars + "]"


def _assemble(tokens: list[tuple[str, str]]) -> str:
    """The regex of one component's tokens (``_glob_tokens`` plus captures).

    See ``LogPattern`` for the atomic groups.
    """
    out: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        kind, regex = tokens[i]
        if kind != "star":
            out.append(regex)
            i += 1
            continue
        j = i
        while j < n and tokens[j][0] == "star":
            j += 1
        k = j
        while k < n and tokens[k][0] == "lit":
            k += 1
        literal = "".join(regex for _, regex in tokens[j:k])
        if k == n:
            out.append(f"[^/]*{literal}")
        elif tokens[k][0] == "star":
            out.append(f"(?>[^/]*?{literal})")  # the literal's first occurrence: nothing to retry later
        else:
            out.append(f"[^/]*?{literal}")  # before a capture, which may need it to give back
        i = k
    return "".join(out)
