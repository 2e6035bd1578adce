"""``rebound bench ...``: benchmarks: ``recovery`` against the local lab (see ``workers.bench.recovery``),
``detection`` of failure categories in a labelled corpus of real logs (see ``workers.bench.detection``),
``attribution`` of failures to nodes on recorded multi-rank logs (see ``workers.bench.attribution``), and
``healthy``, the false-positive run of a healthy job on the lab (see ``workers.bench.healthy``).

Only the argument parser lives here, so that ``rebound --help`` stays fast: the benchmarks import the lab,
Temporal and the workflows when they run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["add_bench_parser"]


def add_bench_parser(sub: Any) -> None:
    """Add ``bench recovery [--scenarios LIST] [--repeat N] [--json PATH]``,
    ``bench detection [--corpus PATH] [--json PATH]`` and ``bench attribution [--scenarios DIR] [--json PATH]``
    to the ``rebound`` subcommands."""
    bench = sub.add_parser(
        "bench", help="benchmarks: recovery on the lab, detection on a log corpus, attribution on recorded failures"
    )
    cmds = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH_COMMAND")
    rec = cmds.add_parser(
        "recovery",
        help="inject real faults into the demo job and measure detection, recovery action, resume, lost work",
    )
    rec.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated: rank-crash,node-crash,xid,user-bug (default: all of them, in that order)",
    )
    rec.add_argument("--repeat", type=int, default=3, help="runs per scenario (default 3)")
    rec.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    rec.add_argument("--timeout", type=float, default=180.0, help="seconds from the fault to an outcome, per run")
    rec.add_argument("--warmup-steps", type=int, default=30, help="inject once rank 0 trained this many steps")
    det = cmds.add_parser(
        "detection",
        help="score rebound diagnose on a labelled corpus of real logs: per-category precision/recall/F1",
    )
    det.add_argument(
        "--corpus",
        type=Path,
        default=Path("tests/data/detection/corpus.jsonl"),
        help="JSONL corpus, one labelled log per line (default: tests/data/detection/corpus.jsonl)",
    )
    det.add_argument("--json", type=Path, default=None, help="also write the full result as JSON to this path")
    att = cmds.add_parser(
        "attribution",
        help="score attribution on recorded multi-rank failures: top-1 node accuracy, healthy-node drains",
    )
    att.add_argument(
        "--scenarios",
        type=Path,
        default=Path("tests/data/attribution"),
        help="directory of scenarios, one subdirectory each (default: tests/data/attribution)",
    )
    att.add_argument("--json", type=Path, default=None, help="also write the full result as JSON to this path")
    healthy = cmds.add_parser(
        "healthy",
        help="the false-positive run: a healthy demo job trains on the lab for N minutes; every incident is false",
    )
    healthy.add_argument("--minutes", type=float, default=10.0, help="how long the healthy job trains (default 10)")
    healthy.add_argument("--json", type=Path, default=None, help="also write the result as JSON to this path")
