"""Certificate rotation for running processes: re-read the TLS files when they change, without a restart.

A worker or node agent connects once, then runs for weeks; its client certificate does not. ``CertificateReloader``
is a Temporal client plugin and worker plugin at once: every ``Worker`` built from the client registers with it while
it runs, and a background check compares the TLS files' contents every few seconds. When they change it connects
anew with the new files and, only once that connection works, moves the client (every activity holding it) and
every registered worker onto it (``Worker.client``'s setter swaps the pollers' connection). New files that do not
connect (half written, or not yet trusted by the proxy) leave the current connection in place; they are tried again
at the next check, and the failure is logged each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import temporalio.client
import temporalio.worker
from temporalio.client import Client, ClientConfig, WorkflowHistory
from temporalio.service import ConnectConfig, ServiceClient
from temporalio.worker import Replayer, ReplayerConfig, Worker, WorkerConfig, WorkflowReplayResult

from workers.settings import TemporalSettings

__all__ = ["CERT_CHECK_INTERVAL_S", "CertificateReloader", "tls_files_digest"]

log = logging.getLogger(__name__)

#: How often the TLS files are compared with the ones in use (reading three small files: negligible); the
#: default of ``temporal.tls_reload_s``.
CERT_CHECK_INTERVAL_S = 5.0

Reconnect = Callable[[], Awaitable[Client]]


def tls_files_digest(settings: TemporalSettings) -> tuple[str, ...]:
    """A digest of each TLS file's contents (server CA, client certificate, key); ``-`` for one unset or
    unreadable. Contents, not modification times: a touch is not a rotation, and a copy that keeps the old time is."""
    paths: Sequence[Path | None] = (
        settings.tls_server_ca_path,
        settings.tls_client_cert_path,
        settings.tls_client_key_path,
    )
    digests: list[str] = []
    for path in paths:
        try:
            digests.append(hashlib.sha256(path.read_bytes()).hexdigest() if path else "-")
        except OSError:
            digests.append("-")
    return tuple(digests)


class CertificateReloader(temporalio.client.Plugin, temporalio.worker.Plugin):
    """Moves a client, and the workers running on it, to a new connection when the TLS files change.

    Args:
        settings: The Temporal settings whose files are watched.
        reconnect: Connects a new client with the files as they are now (``workers.client.connect`` without this
            plugin); raises when they do not work.
        interval_s: Seconds between two checks.
    """

    def __init__(self, settings: TemporalSettings, reconnect: Reconnect, *, interval_s: float = CERT_CHECK_INTERVAL_S):
        self._settings = settings
        self._reconnect = reconnect
        self._interval_s = interval_s
        self._digest = tls_files_digest(settings)
        self._client: Client | None = None
        self._workers: set[Worker] = set()
        self._task: asyncio.Task[None] | None = None
        #: Rotations applied so far, and the last rotation that failed (for tests and `rebound` diagnostics).
        self.reloads = 0
        self.last_error: str | None = None

    def attach(self, client: Client) -> None:
        """The client this plugin moves (``connect`` calls it once the client exists)."""
        self._client = client

    # ----- the check -------------------------------------------------------------------------------------------
    async def check_once(self) -> bool:
        """Compare the files with those in use; on a change, reconnect and move everything. True if it moved."""
        digest = tls_files_digest(self._settings)
        if digest == self._digest or self._client is None:
            return False
        try:
            fresh = await self._reconnect()
        except Exception as e:  # noqa: BLE001 - any failure leaves the working connection; it is retried
            self.last_error = str(e)
            log.error("the TLS files changed but do not connect; keeping the current connection: %s", e)
            return False
        # temporalio has no public way to change a live connection's TLS: the client's service client is replaced
        # in place, so every object that holds this Client (activities, schedules, the Fleet's starter) follows.
        self._client._config["service_client"] = fresh.service_client
        for worker in list(self._workers):
            worker.client = self._client  # the pollers move to the new connection
        self._digest = digest
        self.reloads += 1
        self.last_error = None
        log.info("TLS files changed: reconnected to %s with the new certificates", self._settings.address)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check_once()

    # ----- client plugin: nothing to change ----------------------------------------------------------------------
    def configure_client(self, config: ClientConfig) -> ClientConfig:
        return config

    async def connect_service_client(
        self, config: ConnectConfig, next: Callable[[ConnectConfig], Awaitable[ServiceClient]]
    ) -> ServiceClient:
        return await next(config)

    # ----- worker plugin: register each running worker -----------------------------------------------------------
    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        self._workers.add(worker)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="rebound-tls-reload")
        try:
            await next(worker)
        finally:
            self._workers.discard(worker)
            if not self._workers and self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        return config

    def run_replayer(
        self,
        replayer: Replayer,
        histories: AsyncIterator[WorkflowHistory],
        next: Callable[
            [Replayer, AsyncIterator[WorkflowHistory]],
            AbstractAsyncContextManager[AsyncIterator[WorkflowReplayResult]],
        ],
    ) -> AbstractAsyncContextManager[AsyncIterator[WorkflowReplayResult]]:
        return next(replayer, histories)
