"""slurmrestd's JWT on the real lab (Slurm 22.05, ``AuthAltTypes=auth/jwt``): refused tokens are told from outages,
renewed tokens keep working. Run under the lab lock (docs/testing.md).

Tokens are real: made by ``scontrol token``, or signed here with the lab's own key (HS256 over
``$STATE/etc/jwt_hs256.key``, as slurmctld checks them) or with another key.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.rest import SlurmRestScheduler, rest_client
from activities.slurm.rest_auth import ScontrolToken, StaticToken, TokenFile, TokenSource
from tests.unit.slurm.jwt_support import slurm_token
from workers.settings import SlurmSettings
from workers.wiring import build_scheduler
from workflows.domain.errors import FailureKind, ReboundError

pytestmark = pytest.mark.lab


@pytest.fixture
def cli(lab: Any) -> SlurmCliScheduler:
    return SlurmCliScheduler(env=lab.slurm_env, timeout_s=15)


def _scheduler(lab: Any, source: TokenSource, cli: SlurmCliScheduler | None) -> SlurmRestScheduler:
    client = rest_client(url=lab.rest_url, user="root", token_source=source, timeout_s=15)
    return SlurmRestScheduler(client, controller_probe=cli.ping if cli is not None else None)


async def _error(scheduler: SlurmRestScheduler) -> ReboundError:
    with pytest.raises(ReboundError) as caught:
        await scheduler.list_nodes()
    return caught.value


async def test_a_token_signed_with_the_labs_key_works_and_another_key_is_auth(lab: Any, cli: SlurmCliScheduler) -> None:
    key = lab.layout.jwt_key.read_bytes()
    good = _scheduler(lab, StaticToken(SecretStr(slurm_token("root", 600, key))), cli)
    assert {n.name for n in await good.list_nodes()} == set(lab.nodes)
    forged = slurm_token("root", 600, os.urandom(32))
    error = await _error(_scheduler(lab, StaticToken(SecretStr(forged)), cli))
    assert error.kind is FailureKind.SCHEDULER_AUTH, error
    assert "slurm.rest_token" in error.message and forged not in error.message
    # The very same answer without a way to ask slurmctld: 22.05 cannot tell them apart, so it stays an outage.
    blind = await _error(_scheduler(lab, StaticToken(SecretStr(forged)), None))
    assert blind.kind is FailureKind.SCHEDULER_UNREACHABLE


async def test_an_expired_token_is_auth_not_unreachable(lab: Any, cli: SlurmCliScheduler) -> None:
    expired = lab.lab.slurm.token(lifespan_s=1)
    await asyncio.sleep(2.5)
    # Never sent: Rebound reads exp itself.
    error = await _error(_scheduler(lab, StaticToken(SecretStr(expired)), cli))
    assert error.kind is FailureKind.SCHEDULER_AUTH and "expired at" in error.message
    # Sent anyway (a worker whose clock runs an hour late): slurmctld refuses it, and it is still SCHEDULER_AUTH.
    late: Callable[[], float] = lambda: time.time() - 3600  # noqa: E731
    error = await _error(_scheduler(lab, StaticToken(SecretStr(expired), clock=late), cli))
    assert error.kind is FailureKind.SCHEDULER_AUTH, error
    assert "slurmctld answers scontrol ping" in error.message


async def test_scontrol_tokens_are_renewed_and_keep_working(lab: Any, cli: SlurmCliScheduler) -> None:
    offset = [0.0]

    async def scontrol(*args: str) -> tuple[int, str, str]:
        done = await cli.run("scontrol", *args)
        return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr

    source = ScontrolToken(scontrol, "root", 120, clock=lambda: time.time() + offset[0])
    rest = _scheduler(lab, source, cli)
    await rest.list_nodes()
    first = source.last
    await asyncio.sleep(1.1)  # scontrol's tokens have one-second iat/exp: a new second, a new token
    offset[0] = 90.0  # 30 s left of 120 by the source's clock: renewed before use
    await rest.list_nodes()
    assert source.renewals == 2 and source.last is not None and first is not None
    assert source.last.claims.iat is not None and first.claims.iat is not None
    assert source.last.claims.iat > first.claims.iat  # a new token, and slurmctld took it
    offset[0] = 0.0  # and keeps using it while it has more than a third of its life left
    assert len(await rest.list_nodes()) == len(lab.nodes)
    assert source.renewals == 2


async def test_a_rotated_token_file_is_picked_up(lab: Any, cli: SlurmCliScheduler, tmp_path: Path) -> None:
    path = tmp_path / "slurmrestd.jwt"
    # A lifespan long enough for the first read on a loaded machine (1 s expired before it once), then a wait
    # until it has surely expired, counted from once the token exists (its expiry is at most that plus lifespan).
    lifespan_s = 5
    path.write_text(f"SLURM_JWT={lab.lab.slurm.token(lifespan_s=lifespan_s)}\n")
    made = time.monotonic()
    rest = _scheduler(lab, TokenFile(path), cli)
    await rest.list_nodes()
    await asyncio.sleep(max(0.0, made + lifespan_s + 1.5 - time.monotonic()))
    assert (await _error(rest)).kind is FailureKind.SCHEDULER_AUTH  # the writer stopped: says which file
    fresh = tmp_path / "new"
    fresh.write_text(f"SLURM_JWT={lab.lab.slurm.token(lifespan_s=600)}\n")
    fresh.replace(path)
    assert len(await rest.list_nodes()) == len(lab.nodes)


async def test_the_workers_rest_backend_from_settings(lab: Any) -> None:
    """What the worker builds: slurmrestd with a renewed token for reads, scontrol for actions and the probe."""
    settings = SlurmSettings(
        backend="rest",
        rest_url=lab.rest_url,
        rest_user="root",
        rest_token_lifespan_s=600,
        slurm_conf=Path(lab.slurm_env["SLURM_CONF"]),
    )
    snapshot = await build_scheduler(settings).snapshot()
    assert {n.name for n in snapshot.nodes} == set(lab.nodes)
