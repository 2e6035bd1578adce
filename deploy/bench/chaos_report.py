"""The rows of the chaos scenarios (``tests/e2e/test_chaos.py``, ``rebound bench chaos``) and their table. Pure,
except ``record_row``, which appends one row to the file named by ``$REBOUND_CHAOS_RESULTS`` (if set).

One scenario breaks one part of the lab for ``outage_s`` seconds (slurmctld, a node agent, the Temporal server) or
implicates many nodes at once (a drain storm), and counts what Rebound did that it should not have: a drain, a
requeue or an incident nobody caused, a drain past the breaker's cap, a duplicate drain, a second notification.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workflows.domain.base import Frozen

__all__ = ["RESULTS_ENV", "ChaosRow", "chaos_report", "chaos_table", "read_rows", "record_row"]

#: Set by ``rebound bench chaos``: every chaos test appends its row (one JSON object a line) to this file.
RESULTS_ENV = "REBOUND_CHAOS_RESULTS"


class ChaosRow(Frozen):
    """One chaos scenario's outcome."""

    scenario: str
    outage_s: float
    """How long the part was really down (measured, from the stop to the start), 0 for the drain storm."""
    false_actions: int
    """Drains, requeues, incidents, notifications beyond what the fault called for (0 is the only pass)."""
    recovered: bool
    """Rebound did what the scenario needs once the part was back (watching again, the job resumed, the breaker
    holding)."""
    time_s: float
    """From the start of the outage (the fault, for the storm) to the recovered state."""
    detail: str = ""


def record_row(row: ChaosRow) -> None:
    """Append ``row`` to ``$REBOUND_CHAOS_RESULTS``; nothing when it is unset (``make test``)."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(row.model_dump_json() + "\n")


def read_rows(path: Path) -> list[ChaosRow]:
    """The rows a run wrote (a missing file: none; a torn last line from a killed test is skipped)."""
    if not path.exists():
        return []
    rows: list[ChaosRow] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(ChaosRow.model_validate_json(line))
        except ValueError:
            continue
    return rows


def chaos_table(rows: Sequence[ChaosRow]) -> str:
    """The printed table: scenario, outage, false actions, recovered, time."""
    head = f"{'scenario':<34} {'outage':>8} {'false actions':>13} {'recovered':>9} {'time':>8}"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(
            f"{r.scenario:<34} {r.outage_s:>7.1f}s {r.false_actions:>13d} {'yes' if r.recovered else 'NO':>9} "
            f"{r.time_s:>7.1f}s"
        )
    return "\n".join(out)


def chaos_report(rows: Sequence[ChaosRow], *, outage_s: float, exit_code: int) -> dict[str, Any]:
    """The JSON report: the asked outage, pytest's exit code, every row, and whether all passed."""
    return {
        "outage_s": outage_s,
        "pytest_exit_code": exit_code,
        "passed": exit_code == 0 and bool(rows) and all(r.recovered and r.false_actions == 0 for r in rows),
        "rows": [json.loads(r.model_dump_json()) for r in rows],
    }
