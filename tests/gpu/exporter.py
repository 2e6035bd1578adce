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
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            step = state.drip_chunk or len(state.body) or 1
            for start in range(0, len(state.body), step):
                self.wfile.write(state.body[start : start + step])
                self.wfile.flush()
                state.bytes_sent += len(state.body[start : start + step])
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
