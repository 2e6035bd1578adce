"""``rebound bench recovery``: break the lab's demo job for real and measure how Rebound recovers it.

This module is the command: it runs the benchmark, prints the summary table and writes the JSON report. The
rest lives beside it:

- ``deploy.bench.scenarios``: the scenarios, their ground truth and the fault's target (pure);
- ``deploy.bench.labparse``: the rank and batch logs and ``sinfo``, parsed (pure);
- ``deploy.bench.scoring``: the measures of one run against its ground truth (pure);
- ``deploy.bench.runner``: each run against the lab, from submitting the job to cleaning up (I/O);
- ``deploy.bench.context``: what a lab benchmark runs with (``BenchContext``) and the waits it shares (I/O).

Everything but the runner and the context is pure, so scoring and the report are unit-tested against hand-built objects.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from deploy.bench.context import BenchOptions, write_json_report
from deploy.bench.runner import run_benchmark
from deploy.bench.scenarios import Scenario, parse_scenarios
from deploy.bench.scoring import RunResult
from workers.bench.stats import summarize

STAT_FIELDS = ("detection_s", "action_s", "resume_s", "lost_steps")

# ----- report (pure) ----------------------------------------------------------------------------------------------


def scenario_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    """The JSON of one scenario: statistics over successful runs; false actions over every run."""
    ok = [r for r in runs if not r.failed]
    out: dict[str, Any] = {"runs": len(runs)}
    for name in STAT_FIELDS:
        stats = summarize(getattr(r, name) for r in ok)
        out[name] = stats.model_dump() if stats is not None else None
    out["false_actions"] = sum(r.false_actions for r in runs)
    out["failed_runs"] = len(runs) - len(ok)
    return out


def bench_report(runs: Sequence[RunResult], scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """``{"scenarios": {name: summary}, "runs": [raw results]}``, scenarios in the order asked."""
    return {
        "scenarios": {s: scenario_summary([r for r in runs if r.scenario == s]) for s in scenarios},
        "runs": [r.model_dump(mode="json") for r in runs],
    }


def _cell(stats: dict[str, float] | None, digits: int) -> str:
    if stats is None:
        return "-"
    return "/".join(f"{stats[k]:.{digits}f}" for k in ("mean", "p50", "p95"))


def format_table(report: dict[str, Any]) -> str:
    """A plain aligned text table, one row per scenario; latency cells are ``mean/p50/p95``."""
    header = [
        "scenario",
        "runs",
        "failed",
        "attributed",
        "detection s",
        "action s",
        "resume s",
        "lost steps",
        "false actions",
    ]
    rows = [header, ["", "", "", "", "mean/p50/p95", "mean/p50/p95", "mean/p50/p95", "mean/p50/p95", ""]]
    runs = report.get("runs", [])
    for name, s in report["scenarios"].items():
        mine = [r for r in runs if r["scenario"] == name]
        right = sum(1 for r in mine if r.get("attribution_correct"))
        rows.append(
            [
                name,
                str(s["runs"]),
                str(s["failed_runs"]),
                f"{right}/{len(mine)}",
                _cell(s["detection_s"], 2),
                _cell(s["action_s"], 2),
                _cell(s["resume_s"], 1),
                _cell(s["lost_steps"], 1),
                str(s["false_actions"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# ----- command ----------------------------------------------------------------------------------------------------


def run_bench_command(args: argparse.Namespace) -> int:
    """``rebound bench recovery``: run, print the table, write the JSON; exit 1 when a run failed."""
    from deploy.local.config import LabConfig
    from deploy.local.demo_cmd import lab_settings
    from deploy.local.lab import Lab

    try:
        opts = BenchOptions(
            scenarios=parse_scenarios(args.scenarios),
            repeat=args.repeat,
            run_timeout_s=args.timeout,
            warmup_steps=args.warmup_steps,
        )
    except ValueError as e:  # pydantic's ValidationError is one
        print(f"rebound bench recovery: {e}", file=sys.stderr)
        return 2
    lab = Lab(LabConfig())
    started = time.monotonic()
    runs = asyncio.run(run_benchmark(lab, lab_settings(lab), opts))
    report = bench_report(runs, opts.scenarios)
    print(format_table(report))
    print(f"\n{len(runs)} runs in {time.monotonic() - started:.0f} s")
    if args.json is not None:
        write_json_report(args.json, report)
    return 1 if any(r.failed for r in runs) else 0
