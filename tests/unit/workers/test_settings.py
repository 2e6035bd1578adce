from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.client import tls_config
from workers.settings import SchedulerBackend, Settings


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets what it reads: a shell that sourced a lab's env (``eval "$(rebound lab env)"``) exports
    ``REBOUND_CLUSTER_NAME``, ``REBOUND_CONFIG`` and more, which would outrank the values under test."""
    for name in [n for n in os.environ if n.startswith("REBOUND_")]:
        monkeypatch.delenv(name)


def test_defaults_match_the_lab() -> None:
    s = Settings()
    assert s.temporal.address == "127.0.0.1:7233"
    assert s.temporal.namespace == "default"
    assert s.slurm.backend is SchedulerBackend.CLI
    assert not s.temporal.uses_tls


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBOUND_TEMPORAL__ADDRESS", "temporal.example:7233")
    monkeypatch.setenv("REBOUND_TEMPORAL__NAMESPACE", "training")
    monkeypatch.setenv("REBOUND_CLUSTER_NAME", "eos")
    monkeypatch.setenv("REBOUND_SLURM__BACKEND", "rest")
    monkeypatch.setenv("REBOUND_SLURM__REST_URL", "http://127.0.0.1:6820")
    s = Settings()
    assert (s.temporal.address, s.temporal.namespace, s.cluster_name) == ("temporal.example:7233", "training", "eos")
    assert s.slurm.backend is SchedulerBackend.REST


def test_toml_file_below_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "rebound.toml"
    cfg.write_text('cluster_name = "from-file"\n[temporal]\naddress = "file:7233"\nnamespace = "ns-file"\n')
    monkeypatch.setenv("REBOUND_CONFIG", str(cfg))
    monkeypatch.setenv("REBOUND_TEMPORAL__NAMESPACE", "ns-env")
    s = Settings()
    assert s.cluster_name == "from-file"
    assert s.temporal.address == "file:7233"
    assert s.temporal.namespace == "ns-env"  # environment wins over the file


def test_missing_config_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REBOUND_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(FileNotFoundError, match="nope.toml"):
        Settings()


def test_secrets_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBOUND_TEMPORAL__API_KEY", "super-secret-key")
    monkeypatch.setenv("REBOUND_SLURM__REST_TOKEN", "jwt-secret")
    s = Settings()
    for rendered in (repr(s), str(s), s.model_dump_json()):
        assert "super-secret-key" not in rendered
        assert "jwt-secret" not in rendered
    assert s.temporal.api_key is not None and s.temporal.api_key.get_secret_value() == "super-secret-key"
    assert s.temporal.uses_tls  # an API key implies TLS


def test_unknown_setting_is_rejected() -> None:
    with pytest.raises(ValidationError):
        Settings(temporal={"adress": "typo:1"})


def test_rest_backend_needs_an_endpoint() -> None:
    with pytest.raises(ValidationError, match="rest_url or slurm.rest_socket"):
        Settings(slurm={"backend": "rest"})


def test_client_cert_and_key_come_together(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="set together"):
        Settings(temporal={"tls_client_cert_path": tmp_path / "c.pem"})


def test_tls_config_reads_certificates(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "c.pem").write_bytes(b"CERT")
    (tmp_path / "k.pem").write_bytes(b"KEY")
    s = Settings(
        temporal={
            "tls_server_ca_path": tmp_path / "ca.pem",
            "tls_client_cert_path": tmp_path / "c.pem",
            "tls_client_key_path": tmp_path / "k.pem",
            "tls_server_name": "temporal.internal",
        }
    )
    tls = tls_config(s.temporal)
    assert not isinstance(tls, bool)
    assert (tls.server_root_ca_cert, tls.client_cert, tls.client_private_key, tls.domain) == (
        b"CA",
        b"CERT",
        b"KEY",
        "temporal.internal",
    )
    assert tls_config(Settings().temporal) is False
