"""The lab's certificates and its TLS proxy's nginx configuration (no daemon started: ``nginx -t`` loads it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.local.config import LabConfig
from deploy.local.lab_pki import PkiPaths, ensure_lab_pki, read_api_key
from deploy.local.processes import LabError
from deploy.local.tls_proxy import TlsProxy, pki_paths, render_nginx_conf


def _verify(ca: Path, cert: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiPaths:
    paths = PkiPaths(tmp_path_factory.mktemp("pki") / "tls")
    assert set(ensure_lab_pki(paths)) == {"ca", "server", "worker", "agent", "expired", "other-ca", "rogue", "api_key"}
    return paths


def test_good_certificates_chain_to_the_lab_ca(pki: PkiPaths) -> None:
    for cert in (pki.server_cert, pki.client_cert("worker"), pki.client_cert("agent")):
        assert _verify(pki.ca_cert, cert).returncode == 0
    san = subprocess.run(
        ["openssl", "x509", "-in", str(pki.server_cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in san and "DNS:localhost" in san
    assert pki.ca_key.stat().st_mode & 0o077 == 0
    assert pki.api_key.stat().st_mode & 0o077 == 0


def test_bad_certificates_are_bad_for_the_right_reason(pki: PkiPaths) -> None:
    expired = _verify(pki.ca_cert, pki.bad_cert("expired"))
    assert expired.returncode != 0 and "certificate has expired" in expired.stdout + expired.stderr
    rogue = _verify(pki.ca_cert, pki.bad_cert("rogue"))
    assert rogue.returncode != 0 and "unable to get local issuer" in rogue.stdout + rogue.stderr
    assert _verify(pki.bad_cert("other-ca"), pki.bad_cert("rogue")).returncode == 0


def test_a_second_run_keeps_every_file(pki: PkiPaths) -> None:
    before = {p: p.read_bytes() for p in pki.root.rglob("*") if p.is_file()}
    assert ensure_lab_pki(pki) == []
    assert {p: p.read_bytes() for p in pki.root.rglob("*") if p.is_file()} == before


def test_nginx_config_requires_client_certificates_and_the_api_key(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path, temporal_port=7300, temporal_tls_port=7301, slurmrestd_port=6900)
    pki = pki_paths(cfg)
    conf = render_nginx_conf(cfg, pki, "abc123")
    assert "listen 127.0.0.1:7301 ssl http2;" in conf
    assert "grpc_pass grpc://127.0.0.1:7300;" in conf
    assert "ssl_verify_client on;" in conf
    assert f"ssl_client_certificate {pki.ca_cert};" in conf
    assert '"Bearer abc123" 1;' in conf
    assert "proxy_pass http://127.0.0.1:6900;" in conf  # slurmrestd's TCP (JWT) port, never its unix socket
    assert "$http_authorization" not in conf.split("log_format", 1)[1].split(";", 1)[0]  # the key is never logged
    rotated = render_nginx_conf(cfg, pki, "abc123", client_ca=tmp_path / "new-ca.pem")
    assert f"ssl_client_certificate {tmp_path / 'new-ca.pem'};" in rotated
    with pytest.raises(LabError):
        render_nginx_conf(cfg, pki, 'x"; return 200; #')


@pytest.mark.skipif(shutil.which("nginx", path="/usr/sbin:/usr/bin") is None, reason="nginx-light not installed")
def test_nginx_loads_the_written_config(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path)
    proxy = TlsProxy(cfg)
    proxy.write_conf()  # runs `nginx -t` on it
    assert proxy.conf.stat().st_mode & 0o077 == 0  # it holds the API key
    assert read_api_key(pki_paths(cfg)) in proxy.conf.read_text()
    assert proxy.pid() is None


def test_workers_via_the_proxy_get_their_role_certificate(tmp_path: Path) -> None:
    from deploy.local.services import ReboundServices

    direct = ReboundServices(LabConfig(state_dir=tmp_path))
    assert direct.common_env()["REBOUND_TEMPORAL__ADDRESS"] == "127.0.0.1:7233"  # the default: no detour
    cfg = LabConfig(state_dir=tmp_path, workers_via_proxy=True)
    pki = pki_paths(cfg)
    ensure_lab_pki(pki)
    services = ReboundServices(cfg)
    worker, agent = services.common_env(), services.agent_env("n1")
    assert worker["REBOUND_TEMPORAL__ADDRESS"] == agent["REBOUND_TEMPORAL__ADDRESS"] == "127.0.0.1:7234"
    assert worker["REBOUND_TEMPORAL__TLS_CLIENT_CERT_PATH"] == str(pki.client_cert("worker"))
    assert agent["REBOUND_TEMPORAL__TLS_CLIENT_CERT_PATH"] == str(pki.client_cert("agent"))
    assert agent["REBOUND_TEMPORAL__TLS_SERVER_CA_PATH"] == str(pki.ca_cert)
    assert worker["REBOUND_TEMPORAL__API_KEY"] == read_api_key(pki)
