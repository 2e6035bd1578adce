"""The slurmrestd settings (token sources, TLS, plain http) and the adapter the worker builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.slurm.port import CompositeScheduler
from activities.slurm.rest import SlurmRestScheduler
from activities.slurm.rest_auth import ScontrolToken, SlurmJwtAuth, StaticToken, TokenFile
from tests.unit.slurm.jwt_support import slurm_token
from workers.settings import SlurmSettings
from workers.wiring import build_scheduler


def _rest(**kw: object) -> SlurmSettings:
    return SlurmSettings(backend="rest", **kw)


def _source(settings: SlurmSettings) -> object:
    scheduler = build_scheduler(settings)
    assert isinstance(scheduler, CompositeScheduler)
    reads = scheduler.reads
    assert isinstance(reads, SlurmRestScheduler)
    auth = reads._client.auth
    return auth.source if isinstance(auth, SlurmJwtAuth) else None


def test_each_token_setting_gives_its_source(tmp_path: Path) -> None:
    url = "http://127.0.0.1:6820"
    assert isinstance(_source(_rest(rest_url=url, rest_token=slurm_token())), StaticToken)
    assert isinstance(_source(_rest(rest_url=url, rest_token_file=tmp_path / "jwt")), TokenFile)
    assert isinstance(_source(_rest(rest_url=url, rest_token_lifespan_s=900)), ScontrolToken)
    assert _source(_rest(rest_socket=tmp_path / "sock", rest_token_lifespan_s=900)) is None  # local auth


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rest_url": "http://127.0.0.1:1", "rest_token": "a.b.c", "rest_token_lifespan_s": 600}, "one of"),
        ({"rest_url": "http://127.0.0.1:1", "rest_token_lifespan_s": 30}, "greater than or equal to 60"),
        ({"rest_url": "https://ctl:6820", "rest_client_cert": "/c.pem"}, "together"),
        ({"rest_url": "http://127.0.0.1:6820", "rest_ca_file": "/ca.pem"}, "https://"),
        ({"rest_url": "http://ctl.example:6820"}, "plain http"),
        ({"rest_url": "http://10.0.0.5:6820"}, "plain http"),
    ],
)
def test_rest_settings_that_cannot_work(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _rest(**settings)


def test_loopback_http_and_https_are_accepted() -> None:
    for url in ("http://127.0.0.1:6820", "http://localhost:6820", "http://[::1]:6820", "https://ctl.example:6820"):
        _rest(rest_url=url)
    SlurmSettings(backend="cli", rest_url="http://ctl.example:6820")  # not used by the cli backend
