"""``rebound diagnose PATH... | -``: the root cause of a failed job, from its log files (``activities.logs.diagnose``).

Reads every file named (``-`` is stdin) as a stream, in the order given, so batch logs, per-rank logs and a
node's ``dmesg`` can be judged together. Needs neither Temporal nor Slurm.

Exit codes: 0 nothing found (a healthy log, or only benign chatter), 1 a failure found, 2 usage error: a file
could not be read (said on stderr; the other files are still read and the verdict is printed, but it may be
missing evidence).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the library compiles its table on import: only when the command runs, not for --help
    from activities.logs.diagnosis import Diagnosis, Finding

__all__ = ["add_diagnose_parser", "format_diagnosis", "run_diagnose_command"]

EXIT_NONE, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def add_diagnose_parser(sub: Any) -> None:
    """Add ``diagnose PATH... [--json] [--evidence N]`` to the ``rebound`` subcommands."""
    d = sub.add_parser(
        "diagnose",
        help="find the root cause of a failed training job in its logs (exit 0 none, 1 failure, 2 unreadable)",
    )
    d.add_argument("paths", nargs="+", metavar="PATH", help="log files, read in this order; - reads stdin")
    d.add_argument("--json", action="store_true", help="machine-readable output (the whole diagnosis)")
    d.add_argument("--evidence", type=int, default=3, metavar="N", help="evidence lines shown per finding (default 3)")


def run_diagnose_command(args: argparse.Namespace) -> int:
    """``rebound diagnose``: read, diagnose, print; see the module docstring for the exit codes."""
    from activities.logs.diagnose import Diagnoser
    from activities.logs.streams import read_lines

    diagnoser = Diagnoser()
    unreadable: list[dict[str, str]] = []
    for path in args.paths:
        if path == "-":
            diagnoser.feed("-", read_lines(sys.stdin.buffer))
            continue
        try:
            with open(path, "rb") as f:
                diagnoser.feed(path, read_lines(f))
        except OSError as e:
            reason = e.strerror or str(e)
            unreadable.append({"path": path, "error": reason})
            print(f"rebound diagnose: cannot read {path}: {reason}", file=sys.stderr)
    result = diagnoser.result()
    if args.json:
        data = result.model_dump(mode="json")
        data["unreadable"] = unreadable
        print(json.dumps(data, indent=2))
    else:
        print(format_diagnosis(result, evidence=args.evidence))
    if unreadable:
        return EXIT_USAGE
    return EXIT_FAILURE if result.failed else EXIT_NONE


def format_diagnosis(d: Diagnosis, *, evidence: int = 3) -> str:
    """The verdict, what it implicates and why, then every finding as a table, strongest first."""
    out: list[str] = []
    p = d.primary
    if p is None:
        out.append(f"no failure found ({d.lines_read} lines read)")
    else:
        klass = p.failure_class.value if p.failure_class else "-"
        out.append(
            f"root cause: {p.category.value}  (class {klass}, restart helps: {_yes_no(p.restartable)},"
            f" confidence {d.confidence:.2f})"
        )
        what = " ".join(x for x in (p.exception and p.exception + ":", p.message) if x)
        if what:
            out.append(f"  {what}")
        if p.detail:
            out.append(f"  {p.detail}")
        implicated = _implicated(p)
        out.append(f"  implicated: {implicated or 'nothing specific'}")
        if d.attribution is not None:
            a = d.attribution
            nodes = f", nodes {', '.join(a.implicated_nodes)}" if a.implicated_nodes else ""
            out.append(
                f"  a live recovery would attribute: {a.cause} (class {a.failure_class.value}, retry:"
                f" {_yes_no(a.retryable)}, confidence {a.confidence:.2f}{nodes})"
            )
        out.append("  evidence:")
        out.extend(f"    {e}" for e in p.evidence[: max(0, evidence)])
    if d.findings:
        out.append("")
        out.append("findings (strongest first):")
        rows = [["category", "class", "restart", "role", "conf", "lines", "ranks", "first seen"]]
        for f in d.findings:
            first = f.evidence[0] if f.evidence else None
            rows.append(
                [
                    f.category.value,
                    f.failure_class.value if f.failure_class else "-",
                    _yes_no(f.restartable),
                    f.role.value + (" (weak)" if f.weak else ""),
                    f"{f.confidence:.2f}",
                    str(f.lines),
                    _ranges(f.ranks) or "-",
                    f"{first.path}:{first.line}" if first else "-",
                ]
            )
        out.extend("  " + line for line in _table(rows))
        for f in d.findings:
            if f is p or evidence <= 0:
                continue
            out.append(f"  {f.category.value}:")
            out.extend(f"    {e}" for e in f.evidence[:evidence])
    return "\n".join(out)


def _implicated(f: Finding) -> str:
    parts = []
    if f.rank is not None:
        parts.append(f"rank {f.rank}")
    if f.host:
        parts.append(f"host {f.host}")
    if f.gpu is not None:
        parts.append(f"GPU {f.gpu}")
    if f.xid is not None:
        parts.append(f"XID {f.xid}")
    if f.peer_rank is not None:
        parts.append(f"peer rank {f.peer_rank}")
    if f.exit_code is not None:
        parts.append(f"exit code {f.exit_code}")
    if f.signal is not None:
        parts.append(f"signal {f.signal}")
    if len(f.ranks) > 1:
        parts.append(f"ranks {_ranges(f.ranks)}")
    return ", ".join(parts)


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _ranges(ranks: Iterable[int]) -> str:
    """``0,1,2,5`` -> ``0-2,5``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
