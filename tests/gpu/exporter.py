"""A stand-in dcgm-exporter: a real HTTP server on 127.0.0.1 (stdlib ``http.server`` in a thread).

Tests change what it serves between scrapes: the page, the status, a delay before answering, a slow drip, or an
endless body (to check that the scraper stops reading at its limit). It counts requests and bytes sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def page(name: str) -> str:
    """A fixture page from tests/data/dcgm."""
    return (DATA / name).read_text()


@dataclass
class ExporterState:
    """What the server answers next; tests assign the fields."""

    body: bytes = b""
    status: int = 200
    content_type: str = CONTENT_TYPE
    delay_s: float = 0.0
    drip_chunk: int = 0
    """When set, the body goes out in chunks of this size with ``drip_pause_s`` between them."""
    drip_pause_s: float = 0.0
    endless: bool = False
    """Send chunks of ``x`` forever (chunked encoding) until the client hangs up."""
    pages: dict[str, bytes] = field(default_factory=dict)
    """Bodies by request path (one exporter standing in for several nodes' exporters); other paths get ``body``."""
    requests: int = 0
    bytes_sent: int = 0
    paths: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        state = self.server.state
        state.requests += 1
        state.paths.append(self.path)
        if state.delay_s:
            time.sleep(state.delay_s)
        try:
            self.send_response(state.status)
            self.send_header("Content-Type", state.content_type)
            if state.endless:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 65536
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    state.bytes_sent += len(chunk)
            body = state.pages.get(self.path, state.body)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            step = state.drip_chunk or len(body) or 1
            for start in range(0, len(body), step):
                self.wfile.write(body[start : start + step])
                self.wfile.flush()
                state.bytes_sent += len(body[start : start + step])
                if state.drip_chunk:
                    time.sleep(state.drip_pause_s)
        except (BrokenPipeError, ConnectionResetError):
            return  # the scraper hung up (its limit or its timeout): expected

    def log_message(self, format: str, *args: object) -> None:
        return  # keep test output clean


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = ExporterState()


@dataclass
class Exporter:
    """A running stand-in exporter."""

    state: ExporterState
    url: str

    def serve(self, text: str, status: int = 200) -> None:
        """Answer the next scrapes with ``text``."""
        self.state.body = text.encode()
        self.state.status = status


@contextmanager
def running_exporter() -> Iterator[Exporter]:
    """Start the server on a free loopback port; stop it (and its threads) on exit."""
    server = _Server()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-dcgm-exporter", daemon=True
    )
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield Exporter(state=server.state, url=f"http://{host!s}:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


#: (metric, type, help) of the counters a page built by ``exporter_page`` carries, as in NVIDIA/dcgm-exporter's
#: default counters CSV.
PAGE_METRICS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons."),
)
_HEALTHY_VALUES = {"DCGM_FI_DEV_GPU_TEMP": 45, "DCGM_FI_DEV_POWER_USAGE": 120.5}


def exporter_page(host: str, gpus: list[tuple[int, str, str]], faults: dict[int, dict[str, float]]) -> str:
    """A dcgm-exporter page for ``gpus`` (index, UUID, PCI bus id), healthy except the values in ``faults``
    (GPU index -> metric -> value), labelled the way dcgm-exporter labels them."""
    out: list[str] = []
    for metric, kind, help_text in PAGE_METRICS:
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for index, uuid, bus in gpus:
            labels = (
                f'gpu="{index}",UUID="{uuid}",pci_bus_id="{bus}",device="nvidia{index}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            value = faults.get(index, {}).get(metric, _HEALTHY_VALUES.get(metric, 0))
            out.append(f"{metric}{{{labels}}} {value}")
    return "\n".join(out) + "\n"
