"""``rebound checkpoints DIR [--json]`` and ``rebound checkpoints restore DIR``: a job's checkpoints as Rebound
checks them (``activities.checkpoints.scan``), and undoing a quarantine (``activities.checkpoints.quarantine``).
Needs neither Temporal nor Slurm.

Exit codes of ``checkpoints DIR``: 0 a valid checkpoint found, 1 none, 2 unreadable (the directory, or no valid
checkpoint while some candidate could not be read). ``restore``: 0 restored or nothing to restore, 1 something
could not be put back (said on stderr), 2 the directory cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.console import print_json

if TYPE_CHECKING:  # the library is imported when the command runs, not for --help
    from workflows.domain.checkpoints import CheckpointReport

__all__ = ["add_checkpoints_parser", "report_json", "run_checkpoints_command"]

EXIT_VALID, EXIT_NONE, EXIT_UNREADABLE = 0, 1, 2


def add_checkpoints_parser(sub: Any) -> None:
    """Add ``checkpoints [restore] DIR [--json]`` to the ``rebound`` subcommands."""
    c = sub.add_parser(
        "checkpoints",
        help="check a job's checkpoints (exit 0 valid found, 1 none, 2 unreadable); 'restore DIR' undoes a quarantine",
    )
    c.add_argument("args", nargs="+", metavar="[restore] DIR", help="the checkpoint directory (ckpt= of the job)")
    c.add_argument("--json", action="store_true", help="machine-readable output")


def run_checkpoints_command(args: argparse.Namespace) -> int:
    """``rebound checkpoints``: see the module docstring for the exit codes."""
    words: list[str] = args.args
    if len(words) == 2 and words[0] == "restore":
        return _restore(Path(words[1]), as_json=args.json)
    if len(words) != 1:
        print("rebound checkpoints: expected DIR or 'restore DIR'", file=sys.stderr)
        return EXIT_UNREADABLE
    from activities.checkpoints.scan import scan_checkpoints
    from workflows.domain.checkpoints import CheckpointStatus

    report = scan_checkpoints(Path(words[0]))
    if report.error:
        print(f"rebound checkpoints: {report.error}", file=sys.stderr)
    if args.json:
        print_json(report_json(report))
    else:
        print(format_report(report))
    if report.error:
        return EXIT_UNREADABLE
    if report.latest_valid is not None:
        return EXIT_VALID
    unreadable = any(c.status is CheckpointStatus.UNREADABLE for c in report.checked)
    return EXIT_UNREADABLE if unreadable else EXIT_NONE


def report_json(report: CheckpointReport) -> dict[str, Any]:
    """The report in the documented ``--json`` shape (``docs/checkpoints.md``)."""
    latest = report.latest_valid
    return {
        "dir": report.dir,
        "format": report.format.value if report.format else None,
        "latest_valid": None
        if latest is None
        else {
            "path": latest.path,
            "step": latest.step,
            "saved_at": latest.saved_at.isoformat() if latest.saved_at else None,
        },
        "incomplete": [{"path": i.path, "step": i.step, "reason": i.reason} for i in report.incomplete],
        "checked": [
            {"path": c.path, "format": c.format.value, "step": c.step, "status": c.status.value, "reason": c.reason}
            for c in report.checked
        ],
    }


def format_report(report: CheckpointReport) -> str:
    """The verdict, then every candidate as a table, newest first."""
    out = [f"{report.dir}: {report.format.value if report.format else 'no checkpoint format recognised'}"]
    latest = report.latest_valid
    if report.error:
        out.append(f"  cannot check: {report.error}")
    elif latest is None:
        out.append("  no valid checkpoint")
    else:
        when = latest.saved_at.strftime("%Y-%m-%d %H:%M:%S UTC") if latest.saved_at else "time unknown"
        step = "?" if latest.step is None else str(latest.step)
        out.append(f"  latest valid: {latest.path} (step {step}, saved {when})")
    if report.checked:
        rows = [["status", "step", "format", "path", "reason"]]
        for c in report.checked:
            name = Path(c.path).name or c.path
            rows.append([c.status.value, "-" if c.step is None else str(c.step), c.format.value, name, c.reason])
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        out.append("")
        out.extend("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows)
    return "\n".join(out)


def _restore(directory: Path, *, as_json: bool) -> int:
    from activities.checkpoints.quarantine import QuarantineRefused, restore_quarantine

    try:
        result = restore_quarantine(directory)
    except QuarantineRefused as e:
        print(f"rebound checkpoints restore: {e}", file=sys.stderr)
        return EXIT_UNREADABLE
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        print(result.summary)
    for problem in result.left:
        print(f"rebound checkpoints restore: {problem}", file=sys.stderr)
    return EXIT_NONE if result.left else EXIT_VALID
