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
  ``/job/{id}``). A bad or expired JWT gives the *same* answer. Over JWT the adapter tells them apart (fail
  closed, say why): a token whose ``exp`` has passed is never sent (``SCHEDULER_AUTH``); after a -1 it asks
  slurmctld another way (``controller_probe``: ``scontrol ping`` over munge), and a controller that answers
  means the token was refused: ``SCHEDULER_AUTH`` (after one retry with a renewed token, where the source can
  renew), never ``SCHEDULER_UNREACHABLE``, which is retried without end. A missing token gives 401, a proxy's
  refusal 403: ``SCHEDULER_AUTH`` too (see ``rest_auth``).
* An unknown path (an API version slurmrestd was not started with) is 404 with a plain-text body.
* TLS: slurmrestd 22.05 has none of its own; behind a TLS proxy the client takes an ``https://`` URL, a CA
  bundle and an optional client certificate (``rest_client``). A handshake that fails (unknown CA, wrong name,
  expired or missing client certificate) is ``SCHEDULER_AUTH``: the peer is not who it should be, or refuses us.

Measured on the 4-node lab: 3-4 ms per request over the unix socket or TCP with JWT.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

import httpx
from pydantic import SecretStr

from activities.slurm.errors import ApiError, SlurmErrno, api_errors
from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.port import gather_snapshot
from activities.slurm.rest_auth import SlurmJwtAuth, StaticToken, TokenSource
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot, SlurmJob, SlurmNode

__all__ = ["SlurmRestScheduler", "rest_client"]

_BODY_LIMIT = 300
#: What nginx's 400 page says when ``ssl_verify_client on`` finds no certificate, or one it does not trust.
_NGINX_CLIENT_CERT = "SSL certificate"


def rest_client(
    url: str | None = None,
    unix_socket: Path | str | None = None,
    user: str | None = None,
    token: SecretStr | None = None,
    timeout_s: float = 15.0,
    *,
    token_source: TokenSource | None = None,
    ca_file: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> httpx.AsyncClient:
    """An httpx client for slurmrestd; the caller owns it and closes it (``await client.aclose()``).

    Args:
        url: slurmrestd over TCP, e.g. ``http://127.0.0.1:6820``, or ``https://`` through a TLS proxy (JWT auth:
            pass ``user`` and ``token`` or ``token_source``).
        unix_socket: slurmrestd's unix socket (``rest_auth/local``: the worker's own uid authenticates).
            Preferred when both are given, since it needs no token that can expire.
        user: ``X-SLURM-USER-NAME`` sent with the token.
        token: A Slurm JWT (``scontrol token``); never logged. Short for ``token_source=StaticToken(token)``.
        timeout_s: Limit for one request.
        token_source: Where the current JWT comes from (renewed tokens: ``rest_auth``).
        ca_file: CA bundle that signed the TLS proxy's certificate (``https://`` only; the system's if None).
        client_cert: Client certificate (PEM) presented to a proxy that verifies clients; with ``client_key``.
        client_key: Its private key (PEM).

    Returns:
        An ``httpx.AsyncClient`` whose base URL is slurmrestd's root; with a token, its ``auth`` is a
        ``SlurmJwtAuth``.

    Raises:
        ReboundError: ``CONFIGURATION`` when neither endpoint is given, a token comes without a user, TLS files
            come with a plain ``http://`` URL, or cannot be loaded.
    """
    headers = {"Accept": "application/json"}
    timeout = httpx.Timeout(timeout_s)
    if unix_socket is not None:
        transport = httpx.AsyncHTTPTransport(uds=str(unix_socket))
        return httpx.AsyncClient(transport=transport, base_url="http://slurmrestd", headers=headers, timeout=timeout)
    if url is None:
        raise ReboundError(FailureKind.CONFIGURATION, "slurmrestd needs a URL or a unix socket")
    if token_source is None and token is not None:
        token_source = StaticToken(token)
    auth: SlurmJwtAuth | None = None
    if token_source is not None:
        if not user:
            raise ReboundError(FailureKind.CONFIGURATION, "a slurmrestd token needs a user name")
        auth = SlurmJwtAuth(token_source, user)
    verify = _tls_context(url, ca_file, client_cert, client_key)
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, auth=auth, verify=verify)


def _tls_context(
    url: str, ca_file: Path | None, client_cert: Path | None, client_key: Path | None
) -> ssl.SSLContext | bool:
    """The TLS context for an ``https://`` URL (True: httpx's default for a plain URL, which never uses it).

    Raises:
        ReboundError: ``CONFIGURATION`` (TLS files with a plain URL, half a client pair, unreadable files).
    """
    tls_files = (ca_file, client_cert, client_key)
    if not url.lower().startswith("https://"):
        if any(f is not None for f in tls_files):
            raise ReboundError(
                FailureKind.CONFIGURATION,
                f"slurm.rest_ca_file/rest_client_cert/rest_client_key need an https:// slurm.rest_url, not {url}",
            )
        return True
    if (client_cert is None) != (client_key is None):
        raise ReboundError(FailureKind.CONFIGURATION, "slurm.rest_client_cert and rest_client_key go together")
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
        if client_cert is not None and client_key is not None:
            context.load_cert_chain(str(client_cert), str(client_key))
    except (OSError, ssl.SSLError) as e:
        raise ReboundError(
            FailureKind.CONFIGURATION,
            f"slurmrestd TLS files unusable (slurm.rest_ca_file {ca_file}, rest_client_cert {client_cert}): {e}",
        ) from e
    return context


class SlurmRestScheduler:
    """``SchedulerReads`` over slurmrestd.

    Args:
        client: From ``rest_client`` (or any client whose base URL is slurmrestd's root). When its ``auth`` is a
            ``SlurmJwtAuth``, refused tokens are told apart from outages (module docstring).
        api_version: The OpenAPI plugin slurmrestd serves (``-s openapi/v0.0.38``).
        parser: Turns ``/jobs`` and ``/nodes`` into models, large documents off the event loop.
        controller_probe: Asks slurmctld whether it is up without the JWT (``SlurmCliScheduler.ping``): raises
            when it is not. Without it, a -1 answer to a token that has not expired stays ``SCHEDULER_UNREACHABLE``.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        api_version: str = "v0.0.38",
        *,
        parser: ParseOffload | None = None,
        controller_probe: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._client = client
        self._prefix = f"/slurm/{api_version}"
        self._parser = parser if parser is not None else ParseOffload()
        self._jwt = client.auth if isinstance(client.auth, SlurmJwtAuth) else None
        self._probe = controller_probe

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

        A JWT that slurmrestd refused is tried once more with a renewed token, where the source can renew it.

        Raises:
            ReboundError: Transport failures and HTTP statuses that carry no Slurm payload, classified; a refused
                token as ``SCHEDULER_AUTH``.
        """
        try:
            return await self._get_once(path)
        except _TokenRefused:
            if self._jwt is None or not self._jwt.source.renewable:
                raise
            self._jwt.source.invalidate()
            return await self._get_once(path)

    async def _get_once(self, path: str) -> bytes:
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
            tls = _tls_failure(e)
            if tls is not None:
                raise ReboundError(
                    FailureKind.SCHEDULER_AUTH,
                    f"{source}: TLS with slurmrestd's proxy failed ({tls}): check slurm.rest_ca_file (the CA that "
                    "signed the proxy's certificate), the proxy's certificate (name, expiry), and "
                    "slurm.rest_client_cert/rest_client_key if the proxy verifies clients",
                ) from e
            raise ReboundError(
                FailureKind.SCHEDULER_UNREACHABLE, f"{source}: slurmrestd unreachable ({type(e).__name__}: {e})"
            ) from e
        status = response.status_code
        if status == 400 and _NGINX_CLIENT_CERT in response.text:
            # nginx's ssl_verify_client over TLS 1.3: the handshake completed, the request is refused.
            raise ReboundError(
                FailureKind.SCHEDULER_AUTH,
                f"{source}: the TLS proxy refused our client certificate ({_body(response)}): set "
                "slurm.rest_client_cert/rest_client_key to a certificate its ssl_client_certificate CA signed",
            )
        if status in (401, 403):
            raise ReboundError(
                FailureKind.SCHEDULER_AUTH,
                f"{source}: HTTP {status}, authentication refused: {_body(response)}. {self._what_to_fix()}",
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
            errors = api_errors(load_payload(response.content, source=source), source=source)
            if not errors:
                raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"{source}: HTTP 500 without errors")
            await self._raise_if_token_refused(source, errors)
            return response.content
        if status >= 500:
            raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, f"{source}: HTTP {status}: {_body(response)}")
        raise ReboundError(FailureKind.SCHEDULER_BAD_RESPONSE, f"{source}: unexpected HTTP {status}: {_body(response)}")

    async def _raise_if_token_refused(self, source: str, errors: tuple[ApiError, ...]) -> None:
        """Over JWT, tell a refused token from an outage (both are -1, "Unspecified error", on 22.05).

        Raises:
            ReboundError: ``SCHEDULER_AUTH`` when the token sent has expired, or slurmctld answers the probe.
        """
        if self._jwt is None or {e.number for e in errors} != {SlurmErrno.UNSPECIFIED}:
            return
        sent = self._jwt.source.last
        if sent is not None and sent.expired(self._jwt.source.now()):
            raise _TokenRefused(
                f"{source}: slurmrestd refused the JWT, which expired at {sent.claims.expires()} while in flight. "
                f"{self._what_to_fix()}",
            )
        if self._probe is None:
            return  # cannot tell: an outage is the safer reading (retried, and the next token is checked first)
        try:
            await self._probe()
        except ReboundError:
            return  # slurmctld does not answer either: an outage, classified by the parser
        raise _TokenRefused(
            f"{source}: slurmrestd answered 'Unspecified error' while slurmctld answers scontrol ping: the JWT "
            f"was refused (signed with another key than slurm.conf's AuthAltParameters jwt_key, made for another "
            f"user than X-SLURM-USER-NAME={self._jwt.user}, or revoked). {self._what_to_fix()}",
        )

    def _what_to_fix(self) -> str:
        if self._jwt is None:
            return "Set slurm.rest_token, rest_token_file or rest_token_lifespan_s, and slurm.rest_user."
        return f"Fix {self._jwt.source.setting} (user slurm.rest_user={self._jwt.user})."


class _TokenRefused(ReboundError):
    """slurmrestd refused the JWT (told from an outage): ``SCHEDULER_AUTH``, tried once more with a renewed token."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.SCHEDULER_AUTH, message)


def _tls_failure(error: BaseException) -> str | None:
    """The TLS error behind a transport failure (httpx wraps httpcore, which wraps ``ssl``), if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return f"{type(current).__name__}: {getattr(current, 'verify_message', '') or current.reason or current}"
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    text = str(error)
    return text if "SSL" in text or "CERTIFICATE" in text else None


def _is_json(response: httpx.Response) -> bool:
    return response.content.lstrip()[:1] == b"{"


def _body(response: httpx.Response) -> str:
    text = " ".join(response.text.split())
    return text[:_BODY_LIMIT] or "(empty body)"
