"""slurmrestd behind a TLS proxy: https with a CA bundle and a client certificate, against a real local TLS server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from activities.slurm.rest import SlurmRestScheduler, rest_client
from tests.unit.slurm import golden
from tests.unit.slurm.jwt_support import slurm_token
from tests.unit.slurm.tls_support import Pki, have_openssl, https_server, make_pki
from workflows.domain.errors import FailureKind, ReboundError

pytestmark = pytest.mark.skipif(not have_openssl(), reason="needs the openssl command to make certificates")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), "proxy-ca")


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("other"), "someone-else")


async def _ping(url: str, **tls: Path) -> None:
    token = SecretStr(slurm_token())
    async with rest_client(url=url, user="root", token=token, timeout_s=5, **tls) as client:  # type: ignore[arg-type]
        await SlurmRestScheduler(client).ping()


async def test_https_with_the_proxys_ca(pki: Pki) -> None:
    with https_server(pki, golden.read("rest_ping.json")) as (url, served):
        await _ping(url, ca_file=pki.ca)
    assert served == ["/slurm/v0.0.38/ping"]


async def test_an_unknown_ca_is_refused_as_auth_not_outage(pki: Pki, other_ca: Pki) -> None:
    with https_server(pki, golden.read("rest_ping.json")) as (url, served), pytest.raises(ReboundError) as caught:
        await _ping(url, ca_file=other_ca.ca)
    assert caught.value.kind is FailureKind.SCHEDULER_AUTH
    assert "rest_ca_file" in caught.value.message and "SSLCertVerificationError" in caught.value.message
    assert served == []  # nothing, the token least of all, went to an unverified peer


async def test_the_system_cas_do_not_trust_a_private_proxy(pki: Pki) -> None:
    with https_server(pki, golden.read("rest_ping.json")) as (url, _), pytest.raises(ReboundError) as caught:
        await _ping(url)
    assert caught.value.kind is FailureKind.SCHEDULER_AUTH


@pytest.mark.parametrize("proxy", ["handshake", "nginx"])
async def test_client_certificate_for_a_verifying_proxy(pki: Pki, proxy: str) -> None:
    kind = {"require_client_cert": True} if proxy == "handshake" else {"like_nginx": True}
    with https_server(pki, golden.read("rest_ping.json"), **kind) as (url, served):
        await _ping(url, ca_file=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key)
        with pytest.raises(ReboundError) as caught:
            await _ping(url, ca_file=pki.ca)  # no client certificate: the proxy refuses the handshake
    assert served == ["/slurm/v0.0.38/ping"]
    assert caught.value.kind is FailureKind.SCHEDULER_AUTH
    assert "rest_client_cert" in caught.value.message


def test_tls_misconfigurations(pki: Pki, tmp_path: Path) -> None:
    cases = [
        {"url": "http://127.0.0.1:6820", "ca_file": pki.ca},  # a CA for a plain URL: TLS would silently be off
        {"url": "https://127.0.0.1:6820", "client_cert": pki.client_cert},  # half a pair
        {"url": "https://127.0.0.1:6820", "ca_file": tmp_path / "missing.pem"},
        {"url": "https://127.0.0.1:6820", "client_cert": pki.client_cert, "client_key": pki.server_key},  # mismatch
    ]
    for case in cases:
        with pytest.raises(ReboundError) as caught:
            rest_client(**case)  # type: ignore[arg-type]
        assert caught.value.kind is FailureKind.CONFIGURATION, case
