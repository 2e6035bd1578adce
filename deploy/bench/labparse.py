"""What the lab writes, parsed (pure): the demo's rank and batch logs, and ``sinfo``'s node rows.

The rank log gives each attempt's steps, the checkpoints it saved and the one it resumed from (the last step
and checkpoint that lost work is measured from); the batch log gives when each attempt's batch script started;
``sinfo`` gives the nodes Rebound drained.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from workflows.constants import job_drain_prefix
from workflows.domain.base import Frozen

# ----- rank logs --------------------------------------------------------------------------------------------------

_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[\w+\] rank=\d+/\d+ node=\S+ (?P<msg>.*)$")
_START = re.compile(r"^starting: job_id=\S+ restart=(?P<restart>\d+)")
_STEP = re.compile(r"^step=(?P<step>\d+) ")
_RESUMED = re.compile(r"^resumed from checkpoint \S+ \(step (?P<step>\d+)\)")
_NO_CHECKPOINT = "no checkpoint found"
_SAVED = re.compile(r"^saved checkpoint \S+ \(step (?P<step>\d+)")
_BATCH = re.compile(r"^(?P<at>\S+Z) \[INFO\] batch job_id=\S+ restart=(?P<restart>\d+) ")


class Attempt(Frozen):
    """One attempt (Slurm restart) of a rank, as its log tells it."""

    restart: int
    started_at: datetime
    resumed_step: int | None = None
    """Checkpoint step loaded (0: started from scratch); None: no resume line (yet)."""
    first_step: int | None = None
    first_step_at: datetime | None = None
    last_step: int | None = None
    saved_steps: tuple[int, ...] = ()


@dataclass
class _Building:
    restart: int
    started_at: datetime
    resumed_step: int | None = None
    steps: list[tuple[int, datetime]] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)

    def freeze(self) -> Attempt:
        first = self.steps[0] if self.steps else None
        return Attempt(
            restart=self.restart,
            started_at=self.started_at,
            resumed_step=self.resumed_step,
            first_step=first[0] if first else None,
            first_step_at=first[1] if first else None,
            last_step=max(s for s, _ in self.steps) if self.steps else None,
            saved_steps=tuple(self.saved),
        )


def parse_rank_log(lines: Iterable[str]) -> list[Attempt]:
    """The attempts in a demo rank log (every attempt appends to the same file), oldest first.

    Lines before the first ``starting:`` line, and lines that are not the trainer's (tracebacks, srun), are
    skipped.
    """
    attempts: list[_Building] = []
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None:
            continue
        at, msg = datetime.fromisoformat(m["at"]), m["msg"]
        if start := _START.match(msg):
            attempts.append(_Building(restart=int(start["restart"]), started_at=at))
            continue
        if not attempts:
            continue
        current = attempts[-1]
        if step := _STEP.match(msg):
            current.steps.append((int(step["step"]), at))
        elif resumed := _RESUMED.match(msg):
            current.resumed_step = int(resumed["step"])
        elif msg.startswith(_NO_CHECKPOINT):
            current.resumed_step = 0
        elif saved := _SAVED.match(msg):
            current.saved.append(int(saved["step"]))
    return [a.freeze() for a in attempts]


def batch_starts(lines: Iterable[str]) -> dict[int, datetime]:
    """When the batch script of each attempt (restart count) started, from ``job-<id>-batch.log``."""
    out: dict[int, datetime] = {}
    for line in lines:
        m = _BATCH.match(line.strip())
        if m is not None:
            out.setdefault(int(m["restart"]), datetime.fromisoformat(m["at"]))
    return out


def resuming_attempt(attempts: Sequence[Attempt], failed_restart: int) -> Attempt | None:
    """The first attempt after ``failed_restart`` that trained a step."""
    return next((a for a in attempts if a.restart > failed_restart and a.first_step is not None), None)


# ----- Slurm output -----------------------------------------------------------------------------------------------


class NodeRow(Frozen):
    node: str
    state: str
    reason: str = ""


def parse_sinfo_nodes(text: str) -> list[NodeRow]:
    """``sinfo -h -N -o '%N|%T|%E'``: one row per node (a node in several partitions appears once)."""
    rows: dict[str, NodeRow] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[0]:
            reason = "" if parts[2] == "none" else parts[2]
            rows.setdefault(parts[0], NodeRow(node=parts[0], state=parts[1], reason=reason))
    return list(rows.values())


def rebound_drained(rows: Iterable[NodeRow], job_id: int) -> list[str]:
    """Nodes whose reason is Rebound's for one of this job's incidents (``rebound: <job>-<n> <cause>``)."""
    return sorted(r.node for r in rows if r.reason.startswith(job_drain_prefix(job_id)))
