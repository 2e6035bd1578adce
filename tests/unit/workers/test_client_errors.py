"""How a failed Temporal connect is reported: refused credentials and an untrusted server are configuration errors
with the reason, not "unreachable"; texts are the SDK's (captured through the lab's TLS proxy)."""

from __future__ import annotations

from pathlib import Path

from workers.client import certificate_reloader, classify_connect_error
from workers.settings import TemporalSettings
from workers.tls_reload import tls_files_digest
from workflows.domain.errors import FailureKind

EXPIRED = (
    "Failed client connect: `get_system_info` call error after connection: Status { code: Unauthenticated, message: "
    '"client certificate rejected by the TLS proxy (FAILED:certificate has expired)", metadata: MetadataMap { '
    'headers: {"server": "nginx/1.22.1"} }, source: None }'
)
WRONG_CA = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { kind: "
    "InvalidData, error: InvalidCertificate(UnknownIssuer) }))"
)
REFUSED = "Failed client connect: Server connection error: tonic::transport::Error(Transport, Connection refused)"

SETTINGS = TemporalSettings(address="127.0.0.1:7234", tls=True)


def test_a_refused_certificate_names_the_reason() -> None:
    err = classify_connect_error(SETTINGS, RuntimeError(EXPIRED))
    assert err.kind is FailureKind.TEMPORAL_AUTH
    assert "refused Rebound's credentials: client certificate rejected by the TLS proxy" in err.message
    assert "certificate has expired" in err.message
    assert "Traceback" not in err.message and "MetadataMap" not in err.message


def test_an_untrusted_server_is_a_configuration_error() -> None:
    err = classify_connect_error(SETTINGS, RuntimeError(WRONG_CA))
    assert err.kind is FailureKind.TEMPORAL_AUTH
    assert "not trusted" in err.message and "tls_server_ca_path does not hold" in err.message


def test_anything_else_is_unreachable() -> None:
    assert classify_connect_error(SETTINGS, RuntimeError(REFUSED)).kind is FailureKind.TEMPORAL_UNREACHABLE
    assert classify_connect_error(SETTINGS, TimeoutError()).kind is FailureKind.TEMPORAL_UNREACHABLE


def test_the_digest_follows_contents_not_times(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("one")
    key.write_text("key")
    settings = TemporalSettings(tls_client_cert_path=cert, tls_client_key_path=key)
    first = tls_files_digest(settings)
    cert.touch()
    assert tls_files_digest(settings) == first
    cert.write_text("two")
    assert tls_files_digest(settings) != first
    key.unlink()
    assert tls_files_digest(settings)[2] == "-"


def test_no_reloader_without_tls(temporal_client: object) -> None:
    from temporalio.client import Client

    assert isinstance(temporal_client, Client)
    assert certificate_reloader(temporal_client) is None
