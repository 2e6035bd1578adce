"""DcgmExporterSource: one node's GPU health from its dcgm-exporter page, scraped centrally over HTTP (httpx, async).

Decisions (docs/gpu-health.md; shared/facts/gpu-signals.md §3, §5):

- The page is parsed by ``activities.gpu.promtext`` (strict, like Prometheus: one bad line fails the scrape)
  and mapped by metric NAME, legacy and DCGM >= 4.6 spellings alike, with both label spellings
  (``Hostname``/``hostname``, ``UUID``/``uuid``, ``modelName``/``model_name``). Per-link, NVSwitch and CPU
  samples and the exporter's own ``DCGM_EXP_*`` metrics are ignored; for MIG, the whole-GPU sample wins.
- DCGM's "blank" sentinels (just below 2**63, 2**31 and at 2**47 for doubles) are not values: NOT_SUPPORTED
  goes to ``unsupported``, NOT_FOUND/NOT_PERMISSIONED to ``errors``, like the NVML source's failed reads.
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
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from activities.gpu.promtext import ExpositionError, PromSample, parse_exposition
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import GpuEvent, GpuEventKind, GpuSample

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_S",
    "SOURCE_NAME",
    "DcgmExporterSource",
    "DcgmPage",
    "DcgmScrape",
    "diff_scrapes",
    "parse_exporter_page",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "dcgm"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
"""An 8-GPU node with every counter enabled and Kubernetes labels is well under 1 MiB."""

_MIB = 1024 * 1024
_BODY_SNIPPET = 200
_DEVICE = re.compile(r"nvidia([0-9]+)")

# DCGM's blank sentinels (dcgm_structs.h): BLANK, then +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED.
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_INT32_BLANK = 0x7FFFFFF0
_FP64_BLANK = 140737488355328.0  # 2**47
_BLANK_KIND = {1: "NOT_FOUND", 2: "NOT_SUPPORTED", 3: "NOT_PERMISSIONED"}


def _int(value: float) -> int:
    return int(value)


def _bool(value: float) -> int:
    return int(value != 0)  # stored as 0/1, validated into the sample's bool field


def _mib(value: float) -> int:
    return int(value * _MIB)


def _milliwatts(value: float) -> int:
    return round(value * 1000)


#: Exporter metric -> (GpuSample field, conversion). Several names may feed one field (legacy and DCGM 4.6).
_FIELDS: dict[str, tuple[str, Callable[[float], int]]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", _int),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("temperature_c", _int),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_gpu_pct", _int),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("utilization_gpu_pct", _int),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("utilization_mem_pct", _int),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", _mib),
    "DCGM_FI_DEV_FB_FREE": ("memory_free_bytes", _mib),
    "DCGM_FI_DEV_FB_TOTAL": ("memory_total_bytes", _mib),
    "DCGM_FI_DEV_FB_RESERVED": ("memory_reserved", _mib),
    "DCGM_FI_DEV_POWER_USAGE": ("power_mw", _milliwatts),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power_mw", _milliwatts),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", _int),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", _int),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clocks_event_reasons", _int),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clocks_event_reasons", _int),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected_volatile", _int),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected_volatile", _int),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected_aggregate", _int),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_aggregate", _int),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", _int),
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": ("retired_pages_sbe", _int),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", _int),
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": ("retired_pages_dbe", _int),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", _bool),
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": ("retired_pages_pending", _bool),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", _bool),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("remap_failure", _bool),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap_pending", _bool),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", _int),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("remapped_rows_uncorrectable", _int),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", _int),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("remapped_rows_correctable", _int),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_count", _int),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("pcie_replay_count", _int),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", _int),
    "DCGM_FI_DEV_XID_ERROR": ("last_xid", _int),
    # Summed into nvlink_crc_errors (flit + data, as the NVML source sums them).
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_crc_flit", _int),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": ("nvlink_crc_flit", _int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_crc_data", _int),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": ("nvlink_crc_data", _int),
}
_COUNTERS = frozenset(
    {
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "remapped_rows_uncorrectable",
        "remapped_rows_correctable",
        "pcie_replay_count",
        "nvlink_crc_flit",
        "nvlink_crc_data",
    }
)
_NON_GPU_LABELS = ("nvlink", "nvswitch", "cpu", "cpucore")
_MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")


@dataclass(frozen=True, slots=True)
class DcgmPage:
    """One parsed exporter page: a sample per GPU (ordered by index), plus what the labels say about the node."""

    samples: tuple[GpuSample, ...]
    driver_version: str = ""
    exporter_hostname: str = ""


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


class _Gpu:
    """One GPU's values while the page is read."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.uuid = ""
        self.pci_bus_id = ""
        self.name = ""
        self.values: dict[str, int] = {}
        self.from_mig: set[str] = set()
        self.unsupported: list[str] = []
        self.errors: list[str] = []

    def put(self, field: str, sample: PromSample, convert: Callable[[float], int]) -> None:
        mig = any(label in sample.labels for label in _MIG_LABELS)
        if field in self.values and (mig or field not in self.from_mig):
            return  # first whole-GPU value wins; a MIG instance's copy only fills a gap
        problem = _problem(sample.value)
        if problem == "NOT_SUPPORTED":
            self.unsupported.append(field)
            return
        if problem == "BLANK":
            return  # DCGM has no value yet: unknown, like a field the page lacks
        if problem:
            self.errors.append(f"{field}: {problem} ({sample.name})")
            return
        if field in _COUNTERS and sample.value < 0:
            self.errors.append(f"{field}: negative value {sample.value} ({sample.name})")
            return
        self.values[field] = convert(sample.value)
        if mig:
            self.from_mig.add(field)
        else:
            self.from_mig.discard(field)


def _problem(value: float) -> str:
    """Why ``value`` is not a reading ("" when it is one): NaN, infinite, or one of DCGM's blank sentinels."""
    if isinstance(value, int):
        if abs(value) >= 2**64:
            return "value out of range"
    elif math.isnan(value):
        return "NaN"
    elif math.isinf(value):
        return "infinite value"
    for base, span in ((_INT64_BLANK, 16), (_INT32_BLANK, 16)):
        if isinstance(value, int) and base <= value < base + span:
            return _BLANK_KIND.get(value - base, "BLANK")
    if value >= float(_INT64_BLANK):  # an int64 sentinel written as a float
        return "BLANK"
    if _FP64_BLANK <= value < _FP64_BLANK + 16:
        return _BLANK_KIND.get(int(value - _FP64_BLANK), "BLANK")
    return ""


def _index(labels: dict[str, str]) -> int | None:
    gpu = labels.get("gpu", "")
    if gpu.isdigit():
        return int(gpu)
    match = _DEVICE.fullmatch(labels.get("device", ""))
    return int(match.group(1)) if match else None


def _label(labels: dict[str, str], *names: str) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def parse_exporter_page(text: str, host: str, *, observed_at: datetime | None = None) -> DcgmPage:
    """Map a dcgm-exporter page to one ``GpuSample`` per GPU.

    Args:
        text: The page, as served at ``/metrics``.
        host: The node the page belongs to, stamped on every sample (the exporter's own host label may differ).
        observed_at: When the page was read, stamped on every sample.

    Returns:
        The GPUs on the page (ordered by index) and the driver version and hostname from the labels.

    Raises:
        ExpositionError: The text is not a valid exposition page.
    """
    page = parse_exposition(text)
    gpus: dict[str, _Gpu] = {}
    driver = hostname = ""
    for sample in page.samples:
        target = _FIELDS.get(sample.name)
        labels = dict(sample.labels)
        if not sample.name.startswith("DCGM_FI_") or any(label in labels for label in _NON_GPU_LABELS):
            continue
        index = _index(labels)
        if index is None:
            continue
        uuid = _label(labels, "UUID", "uuid", "gpu_uuid")
        gpu = gpus.setdefault(uuid or f"index:{index}", _Gpu(index))
        gpu.uuid = gpu.uuid or uuid
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id", "")
        gpu.name = gpu.name or _label(labels, "modelName", "model_name")
        driver = driver or labels.get("DCGM_FI_DRIVER_VERSION", "")
        hostname = hostname or _label(labels, "Hostname", "hostname")
        if target is not None:
            gpu.put(target[0], sample, target[1])
    samples = [_to_sample(gpu, host, observed_at) for gpu in gpus.values()]
    samples.sort(key=lambda s: (s.index, s.uuid))
    return DcgmPage(samples=tuple(samples), driver_version=driver, exporter_hostname=hostname)


def _to_sample(gpu: _Gpu, host: str, observed_at: datetime | None) -> GpuSample:
    values = dict(gpu.values)
    flit, data = values.pop("nvlink_crc_flit", None), values.pop("nvlink_crc_data", None)
    unsupported = list(gpu.unsupported)
    if flit is not None or data is not None:
        values["nvlink_crc_errors"] = (flit or 0) + (data or 0)
    elif {"nvlink_crc_flit", "nvlink_crc_data"} & set(unsupported):
        unsupported.append("nvlink_crc_errors")
    unsupported = [f for f in unsupported if f not in ("nvlink_crc_flit", "nvlink_crc_data", "memory_reserved")]
    reserved = values.pop("memory_reserved", 0)
    if "memory_total_bytes" not in values and "memory_used_bytes" in values and "memory_free_bytes" in values:
        # FB_TOTAL is not in the default counters: DCGM's total is used + free + reserved.
        values["memory_total_bytes"] = values["memory_used_bytes"] + values["memory_free_bytes"] + reserved
    return GpuSample.model_validate(
        {
            **values,
            "host": host,
            "index": gpu.index,
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "name": gpu.name,
            "observed_at": observed_at,
            "unsupported": tuple(dict.fromkeys(unsupported)),
            "errors": tuple(dict.fromkeys(gpu.errors)),  # duplicate series (one per pod) repeat their problems
        }
    )


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
