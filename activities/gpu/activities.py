"""Node-agent activities over a ``GpuSource``: one GPU health read per call, events served by cursor.

The source is injected (``workers/node_agent.py`` passes an ``NvmlSource``); this module only knows the port.
"No driver" and "no library" are facts about the node that a workflow must be able to reason about, so they
come back as a report with ``error`` set instead of an activity failure that retries and then fails the call.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.errors import classified_errors
from activities.gpu.port import GpuSource
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import (
    GpuHealthReport,
    GpuHealthStatus,
    GpuSample,
    NodeHealthCheckInput,
    NodeHealthCheckResult,
    NvmlReadGpuHealthInput,
)
from workflows.policy.gpu_health import verdict_for_report

__all__ = ["GpuActivities", "NvmlReadGpuHealthInput"]


class GpuActivities:
    """The GPU activities of one node agent, bound to that node's source."""

    def __init__(self, source: GpuSource) -> None:
        """Bind the activities to ``source``; it is opened on first use, so a missing driver is reported."""
        self._source = source

    @activity.defn(name="nvml_read_gpu_health")
    async def read_gpu_health(self, params: NvmlReadGpuHealthInput) -> GpuHealthReport:
        """Sample every GPU and return the events after ``params.event_cursor``.

        Blocking NVML calls run in a worker thread so the agent's event loop keeps heartbeating and polling.

        Args:
            params: The cursor from the previous report (0 for everything still buffered).

        Returns:
            The report; ``error`` is set (and the samples empty) when the GPUs cannot be read right now.

        Raises:
            ApplicationError: Non-retryable ``CONFIGURATION`` when the source cannot work on this node at all.
        """
        with classified_errors():
            return await asyncio.to_thread(self._read, params.event_cursor)

    @activity.defn(name="node_health_check")
    async def health_check(self, params: NodeHealthCheckInput) -> NodeHealthCheckResult:
        """The node's fitness after a drain: every GPU read now, events since ``params.since``, one verdict.

        This is the quarantine's health check: run by the node's own agent, so it needs no job slot on a drained
        node (Slurm places no job there) and sees exactly what a job would.
        """
        from activities.gpu.xid_catalog import default_xid_catalog

        with classified_errors():
            report = await asyncio.to_thread(self._read, 0)
        since = params.since
        recent = tuple(e for e in report.events if since is None or e.observed_at is None or e.observed_at >= since)
        report = report.model_copy(update={"events": recent})
        verdict = verdict_for_report(report, catalog=default_xid_catalog(), source="nvml")
        if report.error:
            return NodeHealthCheckResult(
                node=report.host, healthy=False, verdict=verdict, detail=f"GPUs unreadable: {report.error}"
            )
        healthy = verdict.status is not GpuHealthStatus.FAILED
        detail = "; ".join(verdict.reasons[:3]) or f"{len(report.samples)} GPU(s) {verdict.status.value}"
        return NodeHealthCheckResult(node=report.host, healthy=healthy, verdict=verdict, detail=detail)

    def _read(self, cursor: int) -> GpuHealthReport:
        source = self._source
        error = ""
        driver = ""
        samples: list[GpuSample] = []
        try:
            source.open()  # idempotent; retries a failed open on every read, so a driver that loads later is found
            driver = source.driver_version()
            samples = source.sample()
        except ReboundError as exc:
            if exc.kind is not FailureKind.GPU_SOURCE_UNAVAILABLE:
                raise
            error = str(exc)
        # Events after the sample: a loss the sample shows is then usually in the same report.
        batch = source.events_after(cursor)
        return GpuHealthReport(
            host=source.host,
            driver_version=driver,
            samples=tuple(samples),
            events=batch.events,
            error=error,
            next_event_cursor=batch.next_cursor,
            events_missed=batch.missed,
        )
