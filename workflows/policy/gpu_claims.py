"""Signalled GPU faults are claims until the node's own agent confirms them. Pure.

A node agent pushes a GPU fault to the jobs on its node (signal ``gpu_fault_reported``) and to the Fleet
(``node_gpu_fault_reported``). A signal is a message anyone who reaches Temporal can send (docs/security.md), and
a GPU fault is node-level evidence: enough to drain the node for everyone. So before one counts, a fresh read of
the node's agent (``nvml_read_gpu_health`` on the node's own task queue, events since the agent started) must
list the same event (same host, GPU, XID and sequence in the agent's stream). An event the read does not list,
or a node whose agent did not answer, is dropped as evidence and said so; the scheduler and the logs still
have their word.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workflows.domain.gpu import GpuEvent, GpuHealthReport
from workflows.domain.recovery import GpuEventKey

__all__ = ["confirm_gpu_events", "event_key"]


def event_key(event: GpuEvent) -> GpuEventKey:
    """An event's identity in its node's stream: a re-sent signal and the agent's own listing compare equal."""
    return (event.host, event.index, event.xid, event.sequence)


def confirm_gpu_events(
    claimed: Iterable[GpuEvent], reports: Mapping[str, GpuHealthReport | None]
) -> tuple[tuple[GpuEvent, ...], tuple[str, ...]]:
    """The claimed events a fresh read of their node lists (the node's listed copy), and one note per event
    dropped."""
    # The agent's own copy is what counts, not the signal's: a forged signal could name a real event's key with a
    # graver severity (a kernel-log event's ``severity`` decides its action).
    listed = {host: {event_key(e): e for e in report.events} for host, report in reports.items() if report is not None}
    kept: list[GpuEvent] = []
    notes: list[str] = []
    for event in claimed:
        what = f"{event.kind.value}" + (f" XID {event.xid}" if event.xid is not None else "") + f" on {event.host}"
        if event.host not in reports:
            notes.append(f"{what}: not a node of this job, not used as evidence")
        elif reports[event.host] is None:
            notes.append(f"{what}: the node's agent did not answer a fresh read, not used as evidence")
        elif event_key(event) not in listed[event.host]:
            notes.append(f"{what}: the node's agent does not list it in a fresh read (not its report: forged?)")
        else:
            kept.append(listed[event.host][event_key(event)])
    return tuple(kept), tuple(notes)
