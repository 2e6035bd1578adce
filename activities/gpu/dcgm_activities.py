"""The central worker's ``dcgm_scrape_node`` activity: one node's dcgm-exporter page -> report + health verdict.

The activity keeps no state between calls: the diff baseline (the previous scrape's samples) travels in the input
and comes back as ``next_previous``, like the NVML activity's event cursor. Any worker on the task queue can then
serve any call, and a worker restart loses nothing. An exporter that cannot be read is a fact about the node,
not a failed activity: the result carries the error, a ``source_down`` event and a DEGRADED (watch) verdict.
Only a call that can never work (no URL configured, a node name that cannot go into a URL) fails, non-retryably.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from temporalio import activity

from activities.errors import classified_errors
from activities.gpu.dcgm import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, SOURCE_NAME, DcgmExporterSource
from activities.gpu.xid_catalog import default_xid_catalog
from activities.heartbeating import heartbeating
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import (
    DcgmScrapeNodeInput,
    DcgmScrapeNodeResult,
    GpuEvent,
    GpuEventKind,
    GpuHealthReport,
    NodeGpuVerdict,
    XidCatalog,
)
from workflows.domain.gpu_sources import DcgmNodeRead, DcgmReadInput, DcgmReadResult
from workflows.policy.gpu_health import gpu_health_verdict, verdict_for_report
from workflows.policy.gpu_merge import merge_node_verdicts
from workflows.policy.gpu_thresholds import DEFAULT_THRESHOLDS, GpuHealthThresholds

__all__ = [
    "NODE_PLACEHOLDER",
    "DcgmActivities",
    "DcgmScrapeNodeInput",
    "DcgmScrapeNodeResult",
    "DcgmTargets",
    "exporter_url",
]

log = logging.getLogger(__name__)

NODE_PLACEHOLDER = "{node}"
# Slurm node names are host names; anything else (a slash, an @, a space) must not be spliced into a URL.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def exporter_url(node: str, url: str, template: str | None) -> str:
    """The metrics URL for ``node``: ``url`` when given, else ``template`` with ``{node}`` replaced.

    Raises:
        ReboundError: ``CONFIGURATION`` when there is neither, or the node name is not a host name.
    """
    if url:
        return url
    if not template:
        raise ReboundError(
            FailureKind.CONFIGURATION,
            f"no DCGM exporter URL for node {node}: set gpu.dcgm_url_template "
            "(REBOUND_GPU__DCGM_URL_TEMPLATE, e.g. http://{node}:9400/metrics) or pass url",
        )
    if not _NODE_NAME.fullmatch(node):
        raise ReboundError(FailureKind.CONFIGURATION, f"node name {node!r} cannot be put into a URL")
    return template.replace(NODE_PLACEHOLDER, node)


@dataclass(frozen=True, slots=True)
class DcgmTargets:
    """Which nodes have an exporter, and where: ``gpu.dcgm_url_template`` and ``gpu.dcgm_nodes`` (globs; empty:
    every node), as the worker reads them now (the wiring re-reads the settings file, so adding an exporter needs
    no restart)."""

    template: str | None
    nodes: tuple[str, ...] = ()

    def url_for(self, node: str) -> str:
        """The node's exporter URL, or "" when none is configured for it."""
        if not self.template or (self.nodes and not any(fnmatch.fnmatchcase(node, p) for p in self.nodes)):
            return ""
        return exporter_url(node, "", self.template)


class DcgmActivities:
    """DCGM-exporter scrapes for the central worker; stateless, so one instance serves every node."""

    def __init__(
        self,
        url_template: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        catalog: XidCatalog | None = None,
        thresholds: GpuHealthThresholds = DEFAULT_THRESHOLDS,
        transport: httpx.AsyncBaseTransport | None = None,
        targets: Callable[[], DcgmTargets] | None = None,
    ) -> None:
        """Bind the settings.

        Args:
            url_template: ``gpu.dcgm_url_template``, e.g. ``http://{node}:9400/metrics``; None: every call must
                pass ``url``.
            timeout_s: Limit for one scrape, connect to last byte.
            max_bytes: Largest page accepted.
            catalog: The XID catalogue; the packaged one when None (read here, so a broken table stops the
                worker at start, not at the first XID).
            thresholds: The verdict's numbers.
            transport: For tests (``httpx.MockTransport``).
            targets: Which nodes ``dcgm_read_gpus`` reads, asked at every call; None: ``url_template`` for every
                node.
        """
        self._targets = targets or (lambda: DcgmTargets(url_template))
        self._template = url_template
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._catalog = catalog if catalog is not None else default_xid_catalog()
        self._thresholds = thresholds
        self._transport = transport

    @activity.defn(name="dcgm_scrape_node")
    async def scrape_node(self, params: DcgmScrapeNodeInput) -> DcgmScrapeNodeResult:
        """Scrape one node's exporter, diff against ``params.previous`` and judge the GPUs.

        Args:
            params: The node, optionally its URL, and the previous result's ``next_previous``.

        Returns:
            The report (``error`` set and a ``source_down`` event when the exporter could not be read), the
            node's verdict, and the baseline to pass as ``previous`` next time.

        Raises:
            ApplicationError: Non-retryable ``CONFIGURATION`` when no URL is configured or the node name or URL
                cannot work.
        """
        with classified_errors():
            url = exporter_url(params.node, params.url, self._template)
            source = DcgmExporterSource(
                params.node,
                url,
                timeout_s=self._timeout_s,
                max_bytes=self._max_bytes,
                previous=params.previous,
                transport=self._transport,
            )
            try:
                scrape = await source.scrape()
            except ReboundError as exc:
                if exc.kind is not FailureKind.GPU_SOURCE_UNAVAILABLE:
                    raise
                activity.logger.warning("%s", exc)
                down = GpuEvent(
                    kind=GpuEventKind.SOURCE_DOWN,
                    host=params.node,
                    source=SOURCE_NAME,
                    observed_at=datetime.now(UTC),
                )
                report = GpuHealthReport(host=params.node, events=(down,), error=str(exc))
                return DcgmScrapeNodeResult(
                    report=report, verdict=self._verdict(report, params), next_previous=params.previous
                )
            report = GpuHealthReport(
                host=params.node,
                driver_version=scrape.driver_version,
                samples=scrape.samples,
                events=scrape.events,
            )
            return DcgmScrapeNodeResult(
                report=report, verdict=self._verdict(report, params), next_previous=scrape.samples
            )

    def _verdict(self, report: GpuHealthReport, params: DcgmScrapeNodeInput) -> NodeGpuVerdict:
        # Exporter down: judge the last good scrape again (a lost GPU must not look healthier because its
        # exporter died too), with a node-level finding that there is no fresh data.
        stale = not report.samples and bool(report.error)
        error = f"{report.error} (GPU findings are from the last good scrape)" if stale and params.previous else ""
        return gpu_health_verdict(
            report.host,
            params.previous if stale else report.samples,
            previous=params.previous,
            events=report.events,
            catalog=self._catalog,
            thresholds=self._thresholds,
            source=SOURCE_NAME,
            source_error=error or report.error,
        )

    @activity.defn(name="dcgm_read_gpus")
    async def read_gpus(self, params: DcgmReadInput) -> DcgmReadResult:
        """Read the nodes' exporters now, concurrently (attribution and health checks, beside the NVML read).

        Stateless: no earlier scrape to diff against, so the last-XID gauge is evidence without a time (never an
        XID event) and the counters' growth rules do not fire; the state the page shows now (ECC, row remap,
        retired pages, throttling, a lost GPU) is judged. A node without a configured exporter is answered
        ``configured=False``; an exporter that cannot be read is the node's ``report.error``, never an activity
        failure and never healthy.
        """
        with classified_errors():
            targets = self._targets()
            async with heartbeating():  # a worker dying mid-read is retried in seconds (DCGM_READ's heartbeat)
                reads = await asyncio.gather(*(self.read_node(node, targets.url_for(node)) for node in params.nodes))
        nvml = {r.host: r for r in params.nvml}
        return DcgmReadResult(nodes=tuple(self._merged(read, nvml.get(read.node)) for read in reads))

    def _merged(self, read: DcgmNodeRead, nvml: GpuHealthReport | None) -> DcgmNodeRead:
        if nvml is None or read.verdict is None:
            return read
        mine = verdict_for_report(nvml, catalog=self._catalog, thresholds=self._thresholds, source="nvml")
        return read.model_copy(update={"merged": merge_node_verdicts(read.node, (mine, read.verdict))})

    async def read_node(self, node: str, url: str) -> DcgmNodeRead:
        """One node's exporter at ``url`` now, judged ("" for ``url``: not configured, nothing read).

        The reusable read for callers outside a workflow (a health-check job's own step reads the same way).
        """
        if not url:
            return DcgmNodeRead(node=node, configured=False)
        source = DcgmExporterSource(
            node, url, timeout_s=self._timeout_s, max_bytes=self._max_bytes, transport=self._transport
        )
        try:
            scrape = await source.scrape()
        except ReboundError as exc:
            if exc.kind is not FailureKind.GPU_SOURCE_UNAVAILABLE:
                raise
            log.warning("%s", exc)
            report = GpuHealthReport(host=node, error=str(exc))
        else:
            # No baseline: the gauge's XID would be reported as new on every read (events dropped; the verdict
            # names the gauge as undated evidence instead).
            report = GpuHealthReport(host=node, driver_version=scrape.driver_version, samples=scrape.samples)
        verdict = gpu_health_verdict(
            node,
            report.samples,
            catalog=self._catalog,
            thresholds=self._thresholds,
            source=SOURCE_NAME,
            source_error=report.error,
        )
        return DcgmNodeRead(node=node, configured=True, url=url, report=report, verdict=verdict)
