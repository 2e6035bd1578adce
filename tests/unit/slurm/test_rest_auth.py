"""slurmrestd's JWT: claims, the three token sources, renewal, and refused tokens told apart from outages."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from activities.slurm.rest import SlurmRestScheduler
from activities.slurm.rest_auth import (
    ScontrolToken,
    SlurmJwtAuth,
    StaticToken,
    TokenFile,
    read_claims,
    token_from_text,
)
from tests.unit.slurm import golden
from tests.unit.slurm.jwt_support import jwt_hs256, slurm_token
from workflows.domain.errors import FailureKind, ReboundError

_V = "/slurm/v0.0.38"
NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Restd:
    """A slurmrestd that accepts exactly the tokens in ``valid`` and answers a refused one as 22.05 does (500, -1),
    or with ``no_token`` (401) when none is sent."""

    def __init__(self, *valid: str) -> None:
        self.valid = set(valid)
        self.tokens: list[str] = []
        self.ctld_down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        token = request.headers.get("X-SLURM-USER-TOKEN")
        self.tokens.append(token or "")
        if token is None:
            return httpx.Response(401, content=golden.read("rest_jwt_no_token_401.txt"))
        if self.ctld_down or token not in self.valid:
            # Both answers are the same bytes on 22.05 (tests/data/slurm/README.md).
            name = "rest_ctld_down_nodes.json" if self.ctld_down else "rest_jwt_bad_token.json"
            return httpx.Response(500, content=golden.read(name))
        return httpx.Response(200, content=golden.read("sinfo.json"))


async def _error_of(awaitable: object) -> ReboundError:
    with pytest.raises(ReboundError) as caught:
        await awaitable  # type: ignore[misc]  # any coroutine
    return caught.value


def _scheduler(restd: Restd, auth: SlurmJwtAuth, probe: Callable[[], object] | None = None) -> SlurmRestScheduler:
    client = httpx.AsyncClient(transport=httpx.MockTransport(restd), base_url="http://restd", auth=auth)
    return SlurmRestScheduler(client, controller_probe=probe)  # type: ignore[arg-type]  # probe: async callable


async def _ctld_up() -> None:
    return None


async def _ctld_down() -> None:
    raise ReboundError(FailureKind.SCHEDULER_UNREACHABLE, "scontrol ping: Slurmctld(primary) at vm is DOWN")


def test_claims_of_a_slurm_token() -> None:
    token = slurm_token("root", 600, now=NOW)
    claims = read_claims(token, what="t")
    assert (claims.exp, claims.iat, claims.user) == (NOW + 600, NOW, "root")
    assert claims.expires() == "2027-01-15T08:10:00+00:00"
    assert token_from_text(f"SLURM_JWT={token}\n") == token
    assert token_from_text(f"  {token}  ") == token


@pytest.mark.parametrize("bad", ["", "abc", "a.b", "a..c", "a.!!!.c", "x.WzFd.y", "x" * 20000])
def test_what_is_not_a_jwt_is_an_auth_error(bad: str) -> None:
    with pytest.raises(ReboundError) as caught:
        read_claims(bad, what="slurm.rest_token")
    assert caught.value.kind is FailureKind.SCHEDULER_AUTH
    assert "slurm.rest_token" in caught.value.message


async def test_an_expired_static_token_is_never_sent() -> None:
    clock = Clock()
    token = slurm_token(lifespan_s=60, now=NOW)
    restd = Restd(token)
    rest = _scheduler(restd, SlurmJwtAuth(StaticToken(SecretStr(token), clock=clock), "root"), _ctld_up)
    assert len(await rest.list_nodes()) == 4
    clock.now = NOW + 61
    error = await _error_of(rest.list_nodes())
    assert error.kind is FailureKind.SCHEDULER_AUTH
    assert "slurm.rest_token" in error.message and "expired at 2027-01-15T08:01:00+00:00" in error.message
    assert len(restd.tokens) == 1  # the dead token never left the worker
    assert token not in error.message  # the secret is never in an error


async def test_a_refused_token_is_auth_while_the_controller_answers() -> None:
    wrong_key = slurm_token(key=os.urandom(32), now=NOW)
    restd = Restd()  # accepts nothing: a token signed with another key than slurm.conf's
    rest = _scheduler(restd, SlurmJwtAuth(StaticToken(SecretStr(wrong_key), clock=Clock()), "root"), _ctld_up)
    error = await _error_of(rest.list_nodes())
    assert error.kind is FailureKind.SCHEDULER_AUTH
    assert "slurm.rest_token" in error.message and "jwt_key" in error.message
    assert not error.kind.retryable


async def test_the_same_answer_with_the_controller_down_stays_an_outage() -> None:
    token = slurm_token(now=NOW)
    restd = Restd(token)
    restd.ctld_down = True
    rest = _scheduler(restd, SlurmJwtAuth(StaticToken(SecretStr(token), clock=Clock()), "root"), _ctld_down)
    assert (await _error_of(rest.list_nodes())).kind is FailureKind.SCHEDULER_UNREACHABLE
    # Without a probe the adapter cannot tell: an outage is the safer reading (retried, never a state).
    rest = _scheduler(Restd(), SlurmJwtAuth(StaticToken(SecretStr(token), clock=Clock()), "root"))
    assert (await _error_of(rest.list_nodes())).kind is FailureKind.SCHEDULER_UNREACHABLE


async def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "slurmrestd.jwt"
    first, second = slurm_token(lifespan_s=60, now=NOW), slurm_token(lifespan_s=600, now=NOW + 30)
    path.write_text(f"SLURM_JWT={first}\n")
    restd = Restd(first, second)
    rest = _scheduler(restd, SlurmJwtAuth(TokenFile(path, clock=clock), "root"), _ctld_up)
    await rest.list_nodes()
    clock.now = NOW + 61  # the first token died; nobody renewed the file yet
    error = await _error_of(rest.list_nodes())
    assert error.kind is FailureKind.SCHEDULER_AUTH and str(path) in error.message
    tmp = tmp_path / "new"
    tmp.write_text(second)
    tmp.replace(path)  # how a renewer writes it: a new inode, atomically
    await rest.list_nodes()
    assert restd.tokens == [first, second]


async def test_a_token_file_that_is_missing_names_the_file(tmp_path: Path) -> None:
    source = TokenFile(tmp_path / "none", clock=Clock())
    error = await _error_of(source.get())
    assert error.kind is FailureKind.SCHEDULER_AUTH and "none" in error.message


class Scontrol:
    """``scontrol token`` as the CLI adapter runs it: records the argument list, prints ``SLURM_JWT=...``."""

    def __init__(self, clock: Clock, fail: str = "") -> None:
        self.clock = clock
        self.calls: list[tuple[str, ...]] = []
        self.fail = fail
        self.made: list[str] = []

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.calls.append(args)
        if self.fail:
            return 1, "", self.fail
        lifespan = int(args[2].removeprefix("lifespan="))
        token = slurm_token(args[1].removeprefix("username="), lifespan, now=self.clock.now)
        self.made.append(token)
        return 0, f"SLURM_JWT={token}\n", ""


async def test_scontrol_tokens_are_renewed_before_they_expire() -> None:
    clock = Clock()
    scontrol = Scontrol(clock)
    source = ScontrolToken(scontrol, "root", 900, clock=clock)
    restd = Restd()
    rest = _scheduler(restd, SlurmJwtAuth(source, "root"), _ctld_up)
    restd.valid = _Accepting(scontrol)  # type: ignore[assignment]  # whatever scontrol made is valid
    await rest.list_nodes()
    clock.now = NOW + 500  # 400 s left of 900: more than a third, kept
    await rest.list_nodes()
    clock.now = NOW + 601  # 299 s left: renewed before it expires
    await rest.list_nodes()
    assert scontrol.calls == [("token", "username=root", "lifespan=900")] * 2
    assert restd.tokens == [scontrol.made[0], scontrol.made[0], scontrol.made[1]]
    assert source.renewals == 2


async def test_a_refused_scontrol_token_is_renewed_once_then_auth() -> None:
    clock = Clock()
    scontrol = Scontrol(clock)
    source = ScontrolToken(scontrol, "root", 900, clock=clock)
    restd = Restd()  # slurmctld's key changed: nothing we make is accepted
    rest = _scheduler(restd, SlurmJwtAuth(source, "root"), _ctld_up)
    error = await _error_of(rest.list_nodes())
    assert error.kind is FailureKind.SCHEDULER_AUTH
    assert "slurm.rest_token_lifespan_s" in error.message
    assert len(scontrol.calls) == 2 and len(restd.tokens) == 2  # one renewal, one retry: bounded


async def test_a_401_is_retried_once_with_a_renewed_token() -> None:
    clock = Clock()
    scontrol = Scontrol(clock)
    source = ScontrolToken(scontrol, "root", 900, clock=clock)
    answers = iter([httpx.Response(401, content=b"Authentication failure")])

    def restd(request: httpx.Request) -> httpx.Response:
        return next(answers, None) or httpx.Response(200, content=golden.read("sinfo.json"))

    auth = SlurmJwtAuth(source, "u")
    client = httpx.AsyncClient(transport=httpx.MockTransport(restd), base_url="http://r", auth=auth)
    assert len(await SlurmRestScheduler(client).list_nodes()) == 4
    assert len(scontrol.calls) == 2


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("scontrol: error: slurm_request_jwt: Access/permission denied", FailureKind.SCHEDULER_AUTH),
        ("scontrol: error: Invalid user id", FailureKind.SCHEDULER_AUTH),
        ("slurm_request_jwt: Unable to contact slurm controller (connect failure)", FailureKind.SCHEDULER_UNREACHABLE),
    ],
)
async def test_scontrol_token_failures(stderr: str, kind: FailureKind) -> None:
    source = ScontrolToken(Scontrol(Clock(), fail=stderr), "root", 900, clock=Clock())
    error = await _error_of(source.get())
    assert error.kind is kind
    assert "scontrol token username=root" in error.message


class _Accepting:
    """A set-like view of every token ``scontrol`` made so far."""

    def __init__(self, scontrol: Scontrol) -> None:
        self.scontrol = scontrol

    def __contains__(self, token: object) -> bool:
        return token in self.scontrol.made


def test_hs256_tokens_verify_with_their_key() -> None:
    # The helper signs as slurmctld checks: the same key verifies, another does not (guards the test support).
    import base64
    import hashlib
    import hmac

    key = os.urandom(32)
    header, payload, signature = jwt_hs256({"exp": 1}, key).split(".")
    expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)) == expected
