"""A real HTTP webhook receiver on loopback, for notification tests: scripted answers, recorded requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Answer:
    """How the server answers one request: after ``delay_s``, with ``status`` and ``body``."""

    status: int = 200
    body: str = "ok"
    delay_s: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookServer:
    """Answers request i with ``answers[i]`` (the last one repeats); every request is recorded."""

    answers: Sequence[Answer]
    received: list[Received] = field(default_factory=list)
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/services/T000/B000/s3cr3t-token") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def next_answer(self, req: Received) -> Answer:
        with self.lock:
            self.received.append(req)
            return self.answers[min(len(self.received), len(self.answers)) - 1]


@contextmanager
def webhook_server(*answers: Answer) -> Iterator[WebhookServer]:
    """Serve on a free loopback port in a thread until the block ends."""
    state = WebhookServer(answers=answers or (Answer(),))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            req = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
            answer = state.next_answer(req)
            if answer.delay_s:
                time.sleep(answer.delay_s)
            data = answer.body.encode()
            try:
                self.send_response(answer.status)
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
