"""Connecting to Temporal: the embedded dev server, or a remote cluster with TLS/mTLS or an API key."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Sequence
from typing import Literal

from temporalio.client import Client, Interceptor, Plugin
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from workers.settings import TemporalSettings
from workers.tls_reload import CertificateReloader
from workflows.domain.errors import FailureKind, ReboundError


def tls_config(settings: TemporalSettings) -> TLSConfig | bool:
    """Temporal's TLS settings from ours; False when TLS is off. Certificates are read here, once."""
    if not settings.uses_tls:
        return False
    return TLSConfig(
        server_root_ca_cert=settings.tls_server_ca_path.read_bytes() if settings.tls_server_ca_path else None,
        domain=settings.tls_server_name,
        client_cert=settings.tls_client_cert_path.read_bytes() if settings.tls_client_cert_path else None,
        client_private_key=settings.tls_client_key_path.read_bytes() if settings.tls_client_key_path else None,
    )


async def connect(
    settings: TemporalSettings,
    *,
    identity: str | None = None,
    runtime: Runtime | None = None,
    interceptors: Sequence[Interceptor] = (),
    cert_check_s: float | None | Literal["settings"] = "settings",
) -> Client:
    """Connect with the pydantic data converter (workers inherit it from the client).

    ``runtime`` and ``interceptors`` come from ``workers.telemetry.install_telemetry`` (metrics exporter, tracing);
    workers built from the client inherit the interceptors too. With TLS files, the client carries a
    ``CertificateReloader``: while a worker built from it runs, the files are re-read every ``cert_check_s`` seconds
    (``temporal.tls_reload_s`` by default) and a rotation moves the client and its workers to a new connection
    (None: never re-read).

    Raises:
        ReboundError: TEMPORAL_UNREACHABLE when the frontend does not answer in time; CONFIGURATION when a
            certificate file cannot be read; TEMPORAL_AUTH when the frontend (or the TLS proxy before it) refuses
            Rebound's credentials, or its own certificate is not one ``tls_server_ca_path`` trusts: retrying cannot
            help.
    """

    async def reconnect() -> Client:
        return await _connect(settings, identity=identity, runtime=runtime, interceptors=interceptors, plugins=())

    files = (settings.tls_server_ca_path, settings.tls_client_cert_path, settings.tls_client_key_path)
    if cert_check_s == "settings":
        cert_check_s = settings.tls_reload_s
    reloader = None
    if cert_check_s is not None and settings.uses_tls and any(files):
        reloader = CertificateReloader(settings, reconnect, interval_s=cert_check_s)
    client = await _connect(
        settings,
        identity=identity,
        runtime=runtime,
        interceptors=interceptors,
        plugins=(reloader,) if reloader else (),
    )
    if reloader is not None:
        reloader.attach(client)
    return client


def certificate_reloader(client: Client) -> CertificateReloader | None:
    """The client's ``CertificateReloader``, if it watches TLS files."""
    found = [p for p in client.config()["plugins"] if isinstance(p, CertificateReloader)]
    return found[0] if found else None


async def _connect(
    settings: TemporalSettings,
    *,
    identity: str | None,
    runtime: Runtime | None,
    interceptors: Sequence[Interceptor],
    plugins: Sequence[Plugin],
) -> Client:
    try:
        tls = tls_config(settings)
    except OSError as e:
        raise ReboundError(FailureKind.CONFIGURATION, f"cannot read a TLS file: {e}") from e
    try:
        return await asyncio.wait_for(
            Client.connect(
                settings.address,
                namespace=settings.namespace,
                api_key=settings.api_key.get_secret_value() if settings.api_key else None,
                tls=tls,
                data_converter=pydantic_data_converter,
                identity=identity or f"rebound@{socket.gethostname()}",
                runtime=runtime,
                interceptors=interceptors,
                plugins=plugins,
            ),
            timeout=settings.connect_timeout_s,
        )
    except (RuntimeError, TimeoutError) as e:
        raise classify_connect_error(settings, e) from e


_STATUS_MESSAGE = re.compile(r'code: (Unauthenticated|PermissionDenied), message: "((?:[^"\\]|\\.)*)"')
_BAD_SERVER_CERT = re.compile(r"InvalidCertificate\((\w+)")
_SERVER_CERT_REASONS = {
    "UnknownIssuer": "signed by a CA that tls_server_ca_path does not hold",
    "Expired": "expired",
    "NotValidYet": "not valid yet",
    "NotValidForName": "not issued for this address (set tls_server_name to a name it holds)",
    "BadEncoding": "unreadable",
}


def classify_connect_error(settings: TemporalSettings, error: BaseException) -> ReboundError:
    """A failed connect as an operator can act on it: refused credentials and an untrusted server are
    TEMPORAL_AUTH (permanent, with the reason the server or the proxy gave), anything else TEMPORAL_UNREACHABLE.

    The SDK reports all of them as one ``RuntimeError`` whose text carries the gRPC status or the TLS error; this
    is the only place that reads it.
    """
    text = str(error)
    where = f"Temporal at {settings.address} (namespace {settings.namespace})"
    refused = _STATUS_MESSAGE.search(text)
    if refused:
        return ReboundError(
            FailureKind.TEMPORAL_AUTH,
            f"{where} refused Rebound's credentials: {refused.group(2)}. Check REBOUND_TEMPORAL__TLS_CLIENT_CERT_PATH "
            "and _KEY_PATH (a certificate of the CA the server trusts, not expired) and REBOUND_TEMPORAL__API_KEY.",
        )
    untrusted = _BAD_SERVER_CERT.search(text)
    if untrusted:
        reason = _SERVER_CERT_REASONS.get(untrusted.group(1), untrusted.group(1))
        return ReboundError(
            FailureKind.TEMPORAL_AUTH,
            f"{where} is not trusted: its TLS certificate is {reason}. Check REBOUND_TEMPORAL__TLS_SERVER_CA_PATH "
            "and REBOUND_TEMPORAL__TLS_SERVER_NAME.",
        )
    return ReboundError(
        FailureKind.TEMPORAL_UNREACHABLE,
        f"cannot reach {where}: {text or 'timed out'}. "
        "Is the server running (`rebound lab status`), and are REBOUND_TEMPORAL__* set right?",
    )
