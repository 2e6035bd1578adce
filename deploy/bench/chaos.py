"""``rebound bench chaos``: the chaos tests of ``tests/e2e/test_chaos.py``, with longer outages (60 s by default),
run against the test lab; prints a table (scenario, outage, false actions, recovered, time) and writes JSON.

The scenarios are the tests themselves, not a copy: the command runs pytest on that file with
``$REBOUND_CHAOS_OUTAGE_S`` set and collects the row each test appends to ``$REBOUND_CHAOS_RESULTS``
(``deploy.bench.chaos_report``). So it needs a source checkout (the tests directory), and, like ``make test``, the
test lab's lock when other people share the host: ``flock /tmp/rebound-lab.lock rebound bench chaos``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.bench.chaos_report import RESULTS_ENV, chaos_report, chaos_table, read_rows
from deploy.bench.context import write_json_report

__all__ = ["SCENARIOS", "pytest_argv", "run_chaos_command"]

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests" / "e2e" / "test_chaos.py"

#: Scenario name -> the test that runs it.
SCENARIOS: dict[str, str] = {
    "ctld-watch": "test_slurmctld_down_while_a_job_is_watched_takes_no_action",
    "ctld-crash": "test_slurmctld_down_while_a_rank_crashes_recovers_once_it_is_back",
    "ctld-drain": "test_slurmctld_down_during_a_drain_completes_once_it_is_back",
    "agent-kill": "test_a_node_agent_killed_before_attribution_drains_nothing_on_the_jobs_word",
    "temporal": "test_temporal_down_while_a_rank_crashes_loses_and_doubles_nothing",
    "storm": "test_a_drain_storm_holds_at_the_cap_with_one_notification",
}


def parse_scenarios(text: str | None) -> list[str]:
    """``a,b`` -> the scenarios, in the order given; None: every scenario."""
    if not text:
        return list(SCENARIOS)
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    return names


def pytest_argv(scenarios: list[str]) -> list[str]:
    """The pytest command line running exactly these scenarios' tests (printing their rows: ``-s``)."""
    selected = [f"{TESTS}::{SCENARIOS[s]}" for s in scenarios]
    return [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *selected]


def run_chaos_command(args: argparse.Namespace) -> int:
    try:
        scenarios = parse_scenarios(args.scenarios)
    except ValueError as e:
        print(f"rebound bench chaos: {e}", file=sys.stderr)
        return 2
    if not TESTS.exists():
        print(f"rebound bench chaos: needs a source checkout ({TESTS} is missing)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rebound-chaos-") as tmp:
        results = Path(tmp) / "rows.jsonl"
        env = dict(os.environ, REBOUND_CHAOS_OUTAGE_S=f"{args.outage:g}", **{RESULTS_ENV: str(results)})
        started = time.monotonic()
        done = subprocess.run(pytest_argv(scenarios), cwd=REPO, env=env, check=False)
        rows = read_rows(results)
    print(f"\nchaos: {len(rows)} of {len(scenarios)} scenario(s), outage {args.outage:g} s, "
          f"{time.monotonic() - started:.0f} s in all (pytest exit {done.returncode})")  # fmt: skip
    print(chaos_table(rows))
    report = chaos_report(rows, outage_s=args.outage, exit_code=done.returncode)
    if args.json is not None:
        write_json_report(args.json, report)
    return 0 if report["passed"] and len(rows) == len(scenarios) else 1
