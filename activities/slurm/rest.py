"""Scheduler reads over slurmrestd (``openapi/v0.0.38``), parsed by the same functions as the CLI's JSON.

Slurm 22.05's REST API cannot act: there is no node update (``POST /node/n2`` answers 405), no requeue and no
way to set excluded nodes (node updates arrived in v0.0.39, Slurm 23.02). So this adapter implements only
``SchedulerReads``; act through scontrol with
``CompositeScheduler(reads=SlurmRestScheduler(client), actions=SlurmCliScheduler(...))``.

Observed on 22.05.8 (tests/data/slurm):

* ``GET /jobs`` and ``GET /nodes`` return exactly what ``squeue --json``/``sinfo --json`` print.
* An unknown job or node is HTTP 500 with ``errors[].error_number`` 2017/2018; ``get_job``/``get_node`` turn
  those into None.
* slurmctld down is HTTP 500 with ``error_number`` -1 ("Unspecified error"), after about 1 s (2 s for
  ``/job/{id}``). A bad or expired JWT gives the *same* answer, so it is classified ``SCHEDULER_UNREACHABLE``
  too; a missing token gives 401 (``CONFIGURATION``).
* An unknown path (an API version slurmrestd was not started with) is 404 with a plain-text body.

Measured on the 4-node lab: 3-4 ms per request over the unix socket or TCP with JWT.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import httpx
from pydantic import SecretStr

from activities.slurm.errors import api_errors
from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.port import gather_snapshot
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot, SlurmJob, SlurmNode

__all__ = ["SlurmRestScheduler", "rest_client"]

_BODY_LIMIT = 300


def rest_client(
    url: str | None = None,
    unix_socket: Path | str | None = None,
    user: str | None = None,
    token: SecretStr | None = None,
    timeout_s: float = 15.0,
) -> httpx.AsyncClient:
    """An httpx client for slurmrestd; the caller owns it and closes it (``await client.aclose()``).

    Args:
        url: slurmrestd over TCP, e.g. ``http://127.0.0.1:6820`` (JWT auth: pass ``user`` and ``token``).
        unix_socket: slurmrestd's unix socket (``rest_auth/local``: the worker's own uid authenticates).
            Preferred when both are given, since it needs no token that can expire.
        user: ``X-SLURM-USER-NAME`` sent with the token.
        token: A Slurm JWT (``scontrol token``); never logged.
        timeout_s: Limit for one request.

    Returns:
        An ``httpx.AsyncClient`` whose base URL is slurmrestd's root.

    Raises:
        ReboundError: ``CONFIGURATION`` when neither endpoint is given, or a token comes without a user.
    """
    headers = {"Accept": "application/json"}
    timeout = httpx.Timeout(timeout_s)
    if unix_socket is not None:
        transport = httpx.AsyncHTTPTransport(uds=str(unix_socket))
        return httpx.AsyncClient(transport=transport, base_url="http://slurmrestd", headers=headers, timeout=timeout)
    if url is None:
        raise ReboundError(FailureKind.CONFIGURATION, "slurmrestd needs a URL or a unix socket")
    if token is not None:
        if not user:
            raise ReboundError(FailureKind.CONFIGURATION, "a slurmrestd token needs a user name")
        headers["X-SLURM-USER-NAME"] = user
        headers["X-SLURM-USER-TOKEN"] = token.get_secret_value()
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout)


class SlurmRestScheduler:
    """``SchedulerReads`` over slurmrestd.

    Args:
        client: From ``rest_client`` (or any client whose base URL is slurmrestd's root).
        api_version: The OpenAPI plugin slurmrestd serves (``-s openapi/v0.0.38``).
        parser: Turns ``/jobs`` and ``/nodes`` into models, large documents off the event loop.
    """

    def __init__(
        self, client: httpx.AsyncClient, api_version: str = "v0.0.38", *, parser: ParseOffload | None = None
    ) -> None:
        self._client = client
        self._prefix = f"/slurm/{api_version}"
        self._parser = parser if parser is not None else ParseOffload()

    async def snapshot(self) -> ClusterSnapshot:
        """See ``SchedulerReads.snapshot``: ``GET /jobs`` and ``GET /nodes``, concurrently.

        Raises:
            ReboundError: The first failure of the two requests.
        """
        return await gather_snapshot(self)

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """See ``SchedulerReads.list_jobs``.

        Raises:
            ReboundError: Transport, HTTP, Slurm or parse failures, classified.
        """
        path = f"{self._prefix}/jobs"
        return await self._parser.jobs(await self._get_content(path), source=f"GET {path}")

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """See ``SchedulerReads.get_job`` (``GET /job/{id}``).

        Raises:
            ReboundError: As for ``list_jobs``, except that an unknown job is None.
        """
        path = f"{self._prefix}/job/{int(job_id)}"
        try:
            jobs = parse_jobs(await self._get(path), source=f"GET {path}")
        except ReboundError as e:
            if e.kind is FailureKind.JOB_NOT_FOUND:
                return None
            raise
        # An array job's id answers with all its tasks: pick the one asked for.
        return next((job for job in jobs if job.job_id == job_id), None)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """See ``SchedulerReads.list_nodes``.

        Raises:
            ReboundError: Transport, HTTP, Slurm or parse failures, classified.
        """
        path = f"{self._prefix}/nodes"
        return await self._parser.nodes(await self._get_content(path), source=f"GET {path}")

    async def get_node(self, name: str) -> SlurmNode | None:
        """See ``SchedulerReads.get_node`` (``GET /node/{name}``).

        Raises:
            ReboundError: As for ``list_nodes``, except that an unknown node is None.
        """
        path = f"{self._prefix}/node/{quote(name, safe='')}"
        try:
            nodes = parse_nodes(await self._get(path), source=f"GET {path}")
        except ReboundError as e:
            if e.kind is FailureKind.NODE_NOT_FOUND:
                return None
            raise
        return next((node for node in nodes if node.name == name), None)

    async def ping(self) -> None:
        """See ``SchedulerReads.ping`` (``GET /ping``: slurmrestd answers for slurmctld).

        Raises:
            ReboundError: ``SCHEDULER_UNREACHABLE`` unless a controller reports ``UP``.
        """
        path = f"{self._prefix}/ping"
        payload = await self._get(path)
        pings = payload.get("pings")
        if isinstance(pings, list) and any(isinstance(p, dict) and p.get("ping") == "UP" for p in pings):
            return
        raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"GET {path}: no controller is UP ({pings!r:.200})")

    async def _get(self, path: str) -> dict[str, object]:
        """One GET; returns the JSON object of any 200 or 500 answer, whose ``errors`` the parser classifies.

        Raises:
            ReboundError: As ``_get_content``, and ``SCHEDULER_BAD_RESPONSE`` for a body that is not JSON.
        """
        return load_payload(await self._get_content(path), source=f"GET {path}")

    async def _get_content(self, path: str) -> bytes:
        """One GET; the body of any 200 answer (unparsed: large ones are parsed off the event loop), or of a 500
        answer that carries Slurm's ``errors`` (checked here), which the parser classifies.

        Raises:
            ReboundError: Transport failures and HTTP statuses that carry no Slurm payload, classified.
        """
        source = f"GET {path}"
        try:
            response = await self._client.get(path)
        except httpx.UnsupportedProtocol as e:
            raise ReboundError(FailureKind.CONFIGURATION, f"{source}: {e}") from e
        except httpx.ConnectTimeout as e:
            raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"{source}: connect timed out") from e
        except httpx.TimeoutException as e:
            raise ReboundError(FailureKind.SCHEDULER_TIMEOUT, f"{source}: {type(e).__name__}") from e
        except httpx.TransportError as e:
            raise ReboundError(
                FailureKind.SCHEDULER_UNREACHABLE, f"{source}: slurmrestd unreachable ({type(e).__name__}: {e})"
            ) from e
        status = response.status_code
        if status in (401, 403):
            raise ReboundError(
                FailureKind.CONFIGURATION, f"{source}: HTTP {status}, authentication refused: {_body(response)}"
            )
        if status == 404:
            raise ReboundError(
                FailureKind.CONFIGURATION,
                f"{source}: HTTP 404, not served (is slurmrestd started with this -s openapi/ version?)",
            )
        if status == 405:
            raise ReboundError(FailureKind.SCHEDULER_UNSUPPORTED, f"{source}: HTTP 405: {_body(response)}")
        if status == 200:
            return response.content
        if status == 500 and _is_json(response):
            # Slurm's own failures are HTTP 500 with a JSON 'errors' list: classified by the parser.
            if not api_errors(load_payload(response.content, source=source), source=source):
                raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"{source}: HTTP 500 without errors")
            return response.content
        if status >= 500:
            raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"{source}: HTTP {status}: {_body(response)}")
        raise ReboundError(FailureKind.SCHEDULER_BAD_RESPONSE, f"{source}: unexpected HTTP {status}: {_body(response)}")


def _is_json(response: httpx.Response) -> bool:
    return response.content.lstrip()[:1] == b"{"


def _body(response: httpx.Response) -> str:
    text = " ".join(response.text.split())
    return text[:_BODY_LIMIT] or "(empty body)"
