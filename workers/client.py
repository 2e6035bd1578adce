"""Connecting to Temporal: the embedded dev server, or a remote cluster with TLS/mTLS or an API key."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from workers.settings import TemporalSettings
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
) -> Client:
    """Connect with the pydantic data converter (workers inherit it from the client).

    ``runtime`` and ``interceptors`` come from ``workers.telemetry.install_telemetry`` (metrics exporter, tracing);
    workers built from the client inherit the interceptors too.

    Raises:
        ReboundError: TEMPORAL_UNREACHABLE when the frontend does not answer in time, CONFIGURATION when a
            certificate file cannot be read.
    """
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
            ),
            timeout=settings.connect_timeout_s,
        )
    except (RuntimeError, TimeoutError) as e:
        raise ReboundError(
            FailureKind.TEMPORAL_UNREACHABLE,
            f"cannot reach Temporal at {settings.address} (namespace {settings.namespace}): {e or 'timed out'}. "
            "Is the server running (`rebound lab status`), and are REBOUND_TEMPORAL__* set right?",
        ) from e
