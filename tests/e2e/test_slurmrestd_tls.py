"""slurmrestd through the lab's TLS proxy (nginx, ``ssl_verify_client on``; deploy/local/tls_proxy.py): Rebound's
REST client over https with the lab CA and a client certificate, and every refusal classified ``SCHEDULER_AUTH``
with the setting to fix. Run under the lab lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.rest import SlurmRestScheduler, rest_client
from deploy.local.tls_proxy import pki_paths
from workflows.domain.errors import FailureKind, ReboundError

pytestmark = pytest.mark.lab


def _url(lab: Any) -> str:
    return f"https://127.0.0.1:{lab.cfg.slurmrestd_tls_port}"


async def _nodes(lab: Any, **tls: Path | None) -> int:
    token = SecretStr(lab.jwt_token())
    async with rest_client(url=_url(lab), user="root", token=token, timeout_s=15, **tls) as client:  # type: ignore[arg-type]
        probe = SlurmCliScheduler(env=lab.slurm_env, timeout_s=15).ping
        return len(await SlurmRestScheduler(client, controller_probe=probe).list_nodes())


async def _refused(lab: Any, **tls: Path | None) -> ReboundError:
    with pytest.raises(ReboundError) as caught:
        await _nodes(lab, **tls)
    return caught.value


async def test_through_the_proxy_with_the_lab_ca_and_a_client_certificate(lab: Any) -> None:
    if not lab.cfg.tls_proxy:
        pytest.skip("the lab runs without its TLS proxy")
    pki = pki_paths(lab.cfg)
    worker: dict[str, Path | None] = {
        "ca_file": pki.ca_cert,
        "client_cert": pki.client_cert("worker"),
        "client_key": pki.client_key("worker"),
    }
    assert await _nodes(lab, **worker) == len(lab.nodes)

    def client(name: str) -> dict[str, Path | None]:
        return {**worker, "client_cert": pki.bad_cert(name), "client_key": pki.bad_key(name)}

    refusals: dict[str, dict[str, Path | None]] = {
        "no client certificate": {"ca_file": pki.ca_cert},
        "another CA's client certificate": client("rogue"),
        "an expired client certificate": client("expired"),
        "a server CA we do not trust": {**worker, "ca_file": pki.bad_cert("other-ca")},
    }
    for what, tls in refusals.items():
        error = await _refused(lab, **tls)
        assert error.kind is FailureKind.SCHEDULER_AUTH, (what, error)
        assert "slurm.rest_c" in error.message, (what, error)  # names rest_ca_file or rest_client_cert
