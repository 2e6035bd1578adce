"""DcgmExporterSource: one node's GPU health from its dcgm-exporter page, scraped centrally over HTTP (httpx, async).

Decisions (docs/gpu-health.md; shared/facts/gpu-signals.md §3, §5):

- The page is mapped to samples by ``activities.gpu.dcgm_page`` (strict parsing, DCGM's blank sentinels).
- ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the LAST XID, not an event stream: an XID event is a change to a
  non-zero value since the previous scrape (the first scrape reports a non-zero value once). A repeat of the
  same XID between scrapes is invisible here; the node agent's NVML events see it.
- A GPU listed before and absent now gives one ``gpu_missing`` event and stays in the samples with
  ``missing=True`` until it is back, so the verdict keeps failing it.
- Whatever goes wrong fetching (refused, timeout, HTTP error, too big, not UTF-8, not an exposition page, no GPU
  on it) is ``GPU_SOURCE_UNAVAILABLE`` with the URL and the cause; the previous scrape stays the baseline. A
  page over ``max_bytes`` is an error, never parsed cut short: a truncated page would report GPUs missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from activities.gpu.dcgm_page import parse_exporter_page
from activities.gpu.promtext import ExpositionError
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuSample

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "SOURCE_NAME",
    "DcgmExporterSource",
    "DcgmScrape",
    "diff_scrapes",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "dcgm"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""An 8-GPU node with every counter enabled and Kubernetes labels is well under 1 MiB."""

_BODY_SNIPPET = 200


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    """One scrape, diffed against the one before.

    Attributes:
        samples: Every GPU on the page, then every GPU seen before and gone now (``missing=True``).
        events: XIDs (a changed non-zero ``last_xid``) and ``gpu_missing`` for GPUs gone since the previous scrape.
        previous: The baseline this scrape was diffed against (what the verdict's growth rules compare with).
        driver_version: From the ``DCGM_FI_DRIVER_VERSION`` label, when the exporter adds it.
        exporter_hostname: The page's ``Hostname``/``hostname`` label (empty with ``--no-hostname``).
    """

    samples: tuple[GpuSample, ...]
    events: tuple[GpuEvent, ...]
    previous: tuple[GpuSample, ...]
    driver_version: str = ""
    exporter_hostname: str = ""


def _gpu_key(sample: GpuSample) -> str:
    return f"uuid:{sample.uuid}" if sample.uuid else f"index:{sample.index}"


def diff_scrapes(
    host: str,
    previous: Sequence[GpuSample],
    current: Sequence[GpuSample],
    *,
    observed_at: datetime | None = None,
) -> tuple[tuple[GpuSample, ...], tuple[GpuEvent, ...]]:
    """Events between two scrapes, and the current samples completed with the GPUs that vanished.

    Args:
        host: The node, stamped on events.
        previous: The previous scrape's samples (empty before the first scrape).
        current: This scrape's samples.
        observed_at: Stamped on events and on the placeholders of vanished GPUs.

    Returns:
        ``current`` plus a ``missing=True`` placeholder (identity and last XID only) for every GPU of ``previous``
        not on the page now; and the events: an XID for every GPU whose ``last_xid`` changed to a non-zero value
        (or is non-zero on its first appearance), ``gpu_missing`` for every GPU that just vanished.
    """
    before = {_gpu_key(s): s for s in previous}
    now = {_gpu_key(s) for s in current}
    events: list[GpuEvent] = []
    for s in current:
        prev = before.get(_gpu_key(s))
        if s.last_xid and s.last_xid != (prev.last_xid if prev is not None else None):
            events.append(_event(GpuEventKind.XID, host, s, observed_at, xid=s.last_xid))
    gone: list[GpuSample] = []
    for p in previous:
        if _gpu_key(p) in now:
            continue
        if not p.missing:
            events.append(_event(GpuEventKind.GPU_MISSING, host, p, observed_at))
        gone.append(
            GpuSample(
                host=host,
                index=p.index,
                uuid=p.uuid,
                pci_bus_id=p.pci_bus_id,
                name=p.name,
                last_xid=p.last_xid,  # a GPU that comes back with the same last XID is not news
                missing=True,
                observed_at=observed_at,
            )
        )
    return (*current, *gone), tuple(events)


def _event(
    kind: GpuEventKind, host: str, s: GpuSample, observed_at: datetime | None, xid: int | None = None
) -> GpuEvent:
    return GpuEvent(
        kind=kind,
        host=host,
        index=s.index,
        uuid=s.uuid,
        pci_bus_id=s.pci_bus_id,
        xid=xid,
        source=SOURCE_NAME,
        observed_at=observed_at,
    )


class DcgmExporterSource:
    """One node's dcgm-exporter. Keeps the previous scrape's samples to diff against; not safe for concurrent use."""

    def __init__(
        self,
        host: str,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        previous: Sequence[GpuSample] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Create a source; nothing is fetched until ``scrape()``.

        Args:
            host: The node (its scheduler name), stamped on samples and events.
            url: The exporter's metrics URL, e.g. ``http://n1:9400/metrics``.
            timeout_s: Limit for the whole request, connect to last byte (a slow drip counts).
            max_bytes: Largest page accepted (after decompression); a bigger one is an error.
            previous: The baseline for the first diff (a previous scrape's samples kept by the caller).
            transport: For tests (``httpx.MockTransport``); the default is a plain connection.

        Raises:
            ReboundError: ``CONFIGURATION`` for a URL that is not http(s) or does not parse, or bad limits.
        """
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise ReboundError(FailureKind.CONFIGURATION, f"DCGM exporter URL {url!r} does not parse: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ReboundError(FailureKind.CONFIGURATION, f"DCGM exporter URL {url!r} is not an http(s) URL")
        if timeout_s <= 0 or max_bytes <= 0:
            raise ReboundError(FailureKind.CONFIGURATION, "DCGM timeout and page size limit must be positive")
        self._host = host
        self._url = url
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._previous = tuple(previous)
        self._transport = transport

    @property
    def host(self) -> str:
        """The node whose GPUs this source reads."""
        return self._host

    @property
    def url(self) -> str:
        """The exporter URL."""
        return self._url

    @property
    def previous(self) -> tuple[GpuSample, ...]:
        """The samples the next scrape is diffed against (the last successful scrape's)."""
        return self._previous

    async def scrape(self) -> DcgmScrape:
        """Fetch the page, map it, diff it against the previous scrape and make it the new baseline.

        Raises:
            ReboundError: ``GPU_SOURCE_UNAVAILABLE`` when the page cannot be fetched or read (the message says
                which: refused, timeout, HTTP status, too big, not an exposition page, no GPU on it); the
                baseline is then unchanged.
        """
        text = await self._fetch()
        observed_at = datetime.now(UTC)
        try:
            # Off the event loop: about 5 ms for an 8-GPU page, but up to a second for a page at the size limit.
            page = await asyncio.to_thread(parse_exporter_page, text, self._host, observed_at=observed_at)
        except ExpositionError as exc:
            raise self._unavailable(f"not a Prometheus metrics page: {exc}") from exc
        if not page.samples:
            raise self._unavailable("no DCGM GPU metrics on the page (is this dcgm-exporter, and is DCGM running?)")
        if page.exporter_hostname and page.exporter_hostname.split(".")[0] != self._host.split(".")[0]:
            log.warning(
                "DCGM exporter %s says Hostname=%s, scraped for node %s: check gpu.dcgm_url_template",
                self._url,
                page.exporter_hostname,
                self._host,
            )
        baseline = self._previous
        samples, events = diff_scrapes(self._host, baseline, page.samples, observed_at=observed_at)
        self._previous = samples
        return DcgmScrape(
            samples=samples,
            events=events,
            previous=baseline,
            driver_version=page.driver_version,
            exporter_hostname=page.exporter_hostname,
        )

    async def _fetch(self) -> str:
        headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"}
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                # trust_env=False: an in-cluster scrape must not detour through a proxy from the environment.
                httpx.AsyncClient(
                    transport=self._transport, timeout=self._timeout_s, trust_env=False, headers=headers
                ) as client,
                client.stream("GET", self._url) as response,
            ):
                body = bytearray()
                ok = response.status_code == 200
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if not ok and len(body) >= _BODY_SNIPPET:
                        break  # enough of an error page to quote
                    if len(body) > self._max_bytes:
                        raise self._unavailable(
                            f"page larger than {self._max_bytes} bytes: cut off and not parsed "
                            "(raise gpu.dcgm_max_page_bytes if the exporter really serves that much)"
                        )
                if not ok:
                    snippet = body[:_BODY_SNIPPET].decode("utf-8", "replace").strip()
                    raise self._unavailable(f"HTTP {response.status_code}: {snippet!r}")
        except TimeoutError as exc:
            raise self._unavailable(f"no complete answer within {self._timeout_s:g} s") from exc
        except httpx.TimeoutException as exc:
            raise self._unavailable(f"no complete answer within {self._timeout_s:g} s ({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            raise self._unavailable(f"cannot connect: {exc or type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            raise self._unavailable(f"{type(exc).__name__}: {exc}") from exc
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._unavailable(f"the page is not UTF-8 text ({exc})") from exc

    def _unavailable(self, problem: str) -> ReboundError:
        return ReboundError(
            FailureKind.GPU_SOURCE_UNAVAILABLE, f"DCGM exporter {self._url} for {self._host}: {problem}"
        )
