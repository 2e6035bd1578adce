"""One XID, two reports: NVML's event and the driver's kernel-log line describe the same fault, and only the line says
what NVIDIA's decode table needs for NVLink5 XIDs 144-150 (its ``Fatal``/``Nonfatal`` label). Pure.

On a real node the driver reports one fault both ways, NVML's event usually first. Judged by its number alone an
NVLink5 XID is FATAL in the catalogue, so without these rules a ``Nonfatal`` link notice read through NVML would
interrupt the job and drain the node before its labelled line arrived. The rules:

- ``copies_of_one_fault``: two XID events are one fault when they name the same XID on the same GPU within
  ``COPY_WINDOW``, one from the kernel log and one from another source.
- ``one_copy_per_fault``: what the verdicts judge. The copy that carries the driver's words (a label, XID 154's new
  recovery action) stands for the fault; the other copy is dropped, so one fault never counts as a repeat.
- ``awaits_line``: the node agent holds an NVML event whose severity only the line can tell (144-150 without a
  label) for up to ``LINE_WAIT``, where it follows the kernel log, and then judges whichever copy it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from workflows.domain.gpu import GpuEvent, GpuEventKind

__all__ = [
    "COPY_WINDOW",
    "KERNEL_LOG_SOURCE",
    "LABELLED_XIDS",
    "LINE_WAIT",
    "awaits_line",
    "copies_of_one_fault",
    "one_copy_per_fault",
    "told_better",
]

KERNEL_LOG_SOURCE = "kernel log"
"""``GpuEvent.source`` of the node agent's kernel-log events (``activities/kernel``)."""

LABELLED_XIDS = frozenset(range(144, 151))
"""NVLink5 XIDs whose severity is per error: the driver's line labels each one Fatal or Nonfatal (R565+)."""

COPY_WINDOW = timedelta(seconds=10)
"""How far apart NVML's event and the kernel line of one fault may be stamped (the follower polls every 0.2 s; the
kernel stamps its record when printed, the agent NVML's event when read)."""

LINE_WAIT = timedelta(seconds=2)
"""How long the agent holds an unlabelled NVLink5 XID from NVML for its labelled line before judging it by the
catalogue. Ten kernel-log polls: the line is printed as the event is raised."""


def _is_kernel(event: GpuEvent) -> bool:
    return event.source == KERNEL_LOG_SOURCE


def _says_more(event: GpuEvent) -> bool:
    """Whether the event carries the driver's own words about severity (its label, 154's new action)."""
    return event.fatal is not None or event.recovery_action is not None


def copies_of_one_fault(a: GpuEvent, b: GpuEvent) -> bool:
    """Whether ``a`` and ``b`` are one XID reported by the kernel log and by another source (NVML, DCGM)."""
    if a.kind is not GpuEventKind.XID or b.kind is not GpuEventKind.XID or a.xid is None or a.xid != b.xid:
        return False
    if a.host != b.host or _is_kernel(a) == _is_kernel(b):
        return False
    same_gpu = (a.uuid and a.uuid == b.uuid) or (a.index is not None and a.index == b.index)
    if not same_gpu:
        return False
    if a.observed_at is None or b.observed_at is None:
        return False  # undated: nothing says they are one fault
    return abs(a.observed_at - b.observed_at) <= COPY_WINDOW


def one_copy_per_fault(events: Sequence[GpuEvent]) -> tuple[GpuEvent, ...]:
    """``events`` with one copy per fault, in order: a copy is dropped when another copy of the same fault says more
    (a label or a recovery action this one lacks), or says as much and came first."""
    kept: list[GpuEvent] = []
    for i, event in enumerate(events):
        outranked = event.kind is GpuEventKind.XID and any(
            (_says_more(o) and not _says_more(event)) or (_says_more(o) == _says_more(event) and j < i)
            for j, o in enumerate(events)
            if j != i and copies_of_one_fault(event, o)
        )
        if not outranked:
            kept.append(event)
    return tuple(kept)


def told_better(event: GpuEvent, others: Sequence[GpuEvent]) -> bool:
    """Whether another copy of ``event``'s fault says more than it (the labelled line of an unlabelled NVML event)."""
    return any(copies_of_one_fault(event, o) and _says_more(o) and not _says_more(event) for o in others)


def awaits_line(event: GpuEvent, *, kernel_log_followed: bool) -> bool:
    """Whether the agent should wait (``LINE_WAIT``) for the kernel line of this event before judging it: an NVLink5
    XID from a source that prints no label, on a node whose kernel log the agent follows."""
    return (
        kernel_log_followed
        and event.kind is GpuEventKind.XID
        and event.xid in LABELLED_XIDS
        and not _is_kernel(event)
        and event.fatal is None
    )
