"""``rebound bench ...``: the benchmarks that need no lab: ``detection`` of failure categories in a labelled
corpus of real logs (see ``workers.bench.detection``) and ``attribution`` of failures to nodes on recorded
multi-rank logs (see ``workers.bench.attribution``).

The lab's benchmarks (``recovery``, ``healthy``) live in ``deploy.bench`` and plug in beside these through the
``rebound.cli`` entry points (``workers.cli_plugins``). Only the argument parsers live here, so that
``rebound --help`` stays fast: the benchmarks import what they measure when they run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workers.cli_plugins import Commands

__all__ = ["register"]


def _run_detection(args: argparse.Namespace) -> int:
    from workers.bench.detection import run_detection_command

    return run_detection_command(args)


def _run_attribution(args: argparse.Namespace) -> int:
    from workers.bench.attribution import run_attribution_command

    return run_attribution_command(args)


def register(commands: Commands) -> None:
    """Add ``bench detection [--corpus PATH] [--json PATH]``, ``bench attribution [--scenarios DIR] [--json PATH]``."""
    det = commands.benchmark(
        "detection",
        _run_detection,
        help="score rebound diagnose on a labelled corpus of real logs: per-category precision/recall/F1",
    )
    det.add_argument(
        "--corpus",
        type=Path,
        default=Path("tests/data/detection/corpus.jsonl"),
        help="JSONL corpus, one labelled log per line (default: tests/data/detection/corpus.jsonl)",
    )
    det.add_argument(
        "--kernel-corpus",
        type=Path,
        default=Path("tests/data/detection/kernel.jsonl"),
        help="JSONL dmesg excerpts labelled with node events, scored against the node agent's kernel-line parser "
        "(default: tests/data/detection/kernel.jsonl; skipped when absent)",
    )
    det.add_argument("--json", type=Path, default=None, help="also write the full result as JSON to this path")
    att = commands.benchmark(
        "attribution",
        _run_attribution,
        help="score attribution on recorded multi-rank failures: top-1 node accuracy, healthy-node drains",
    )
    att.add_argument(
        "--scenarios",
        type=Path,
        default=Path("tests/data/attribution"),
        help="directory of scenarios, one subdirectory each (default: tests/data/attribution)",
    )
    att.add_argument("--json", type=Path, default=None, help="also write the full result as JSON to this path")
