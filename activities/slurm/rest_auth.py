"""slurmrestd's JWT: where Rebound gets it, when it renews it, and how it is sent.

A Slurm JWT (``scontrol token``, or signed with slurm.conf's ``AuthAltParameters=jwt_key``: HS256) carries its
expiry in the payload's ``exp``. Rebound never verifies the signature (it has no key); it reads ``exp`` so that
it never sends a token it knows is dead and renews one before it dies. Three sources, one per setting:

* ``StaticToken`` (``slurm.rest_token``): cannot be renewed. Past ``exp`` it is not sent: ``SCHEDULER_AUTH``
  at once, naming the setting, instead of slurmrestd's "Unspecified error" that reads like an outage.
* ``TokenFile`` (``slurm.rest_token_file``): whatever renews the token (a timer running ``scontrol token``, a
  secrets agent) writes the file; it is read again whenever it changes (inode, size or mtime), and a token in it
  that has expired is ``SCHEDULER_AUTH`` naming the file (the writer has stopped).
* ``ScontrolToken`` (``slurm.rest_token_lifespan_s``): ``scontrol token username=U lifespan=N`` (an argument
  list, through the CLI adapter), run again when a third of the lifespan is left, and at once after slurmrestd
  refused the token.

``SlurmJwtAuth`` is the ``httpx.Auth`` that puts the current token on every request, and retries a 401 once
with a renewed one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import SecretStr

from activities.slurm.errors import kind_from_text
from workflows.domain.errors import FailureKind, ReboundError

__all__ = [
    "JwtClaims",
    "ScontrolToken",
    "SlurmJwtAuth",
    "StaticToken",
    "Token",
    "TokenFile",
    "TokenSource",
    "read_claims",
    "token_from_text",
]

log = logging.getLogger(__name__)

#: Runs ``scontrol ARGS``: (exit status, stdout, stderr). The CLI adapter's ``run`` fits behind a lambda.
ScontrolRun = Callable[..., Awaitable[tuple[int, str, str]]]

_PREFIX = "SLURM_JWT="
#: A token of more than this many bytes is not a Slurm JWT (they are ~150): refuse to hold or send it.
_MAX_TOKEN_BYTES = 16_384


@dataclass(frozen=True)
class JwtClaims:
    """What Rebound reads from a JWT's payload (unverified: slurmctld verifies)."""

    exp: float | None
    """Expiry, seconds since the epoch; None when the token has none (Slurm's always do)."""
    iat: float | None = None
    user: str = ""
    """``sun``: the Slurm user the token was made for."""

    def expires(self) -> str:
        """``exp`` for people: ISO 8601 UTC, or "never"."""
        return "never" if self.exp is None else datetime.fromtimestamp(self.exp, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Token:
    """A token and its claims."""

    value: SecretStr
    claims: JwtClaims

    def expired(self, now: float) -> bool:
        return self.claims.exp is not None and self.claims.exp <= now


def token_from_text(text: str) -> str:
    """The token in ``text``: bare, or as ``scontrol token`` prints it (``SLURM_JWT=eyJ...``), blanks ignored."""
    value = text.strip()
    for line in value.splitlines():
        if line.strip().startswith(_PREFIX):
            return line.strip().removeprefix(_PREFIX).strip()
    return value


def read_claims(token: str, *, what: str) -> JwtClaims:
    """The claims of a JWT (header.payload.signature, base64url), without verifying its signature.

    Args:
        token: The JWT.
        what: Where it came from (a setting, a file), for the error.

    Raises:
        ReboundError: ``SCHEDULER_AUTH`` when it is not a JWT: slurmrestd would refuse it.
    """
    parts = token.split(".")
    if len(token) > _MAX_TOKEN_BYTES or len(parts) != 3 or not all(parts):
        raise ReboundError(FailureKind.SCHEDULER_AUTH, f"{what} is not a JWT (header.payload.signature)")
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError) as e:
        raise ReboundError(FailureKind.SCHEDULER_AUTH, f"{what} is not a JWT: its payload does not decode ({e})") from e
    if not isinstance(payload, dict):
        raise ReboundError(FailureKind.SCHEDULER_AUTH, f"{what} is not a JWT: its payload is not an object")
    user = payload.get("sun")
    return JwtClaims(
        exp=_number(payload.get("exp")), iat=_number(payload.get("iat")), user=user if isinstance(user, str) else ""
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class TokenSource(ABC):
    """Where the current token comes from.

    Args:
        setting: The setting an operator fixes when the token is refused (named in every error).
        clock: Seconds since the epoch (tests pass their own).
    """

    def __init__(self, setting: str, clock: Callable[[], float] = time.time) -> None:
        self.setting = setting
        self._clock = clock
        self.last: Token | None = None
        """The token most recently handed out."""

    @property
    def renewable(self) -> bool:
        """Whether ``invalidate`` can get a different token."""
        return False

    @abstractmethod
    async def get(self) -> Token:
        """A token believed valid now.

        Raises:
            ReboundError: ``SCHEDULER_AUTH`` (no usable token), or what fetching one raises.
        """

    def invalidate(self) -> None:  # noqa: B027  # a no-op for a source that cannot renew
        """slurmrestd refused the last token: the next ``get`` fetches another where it can."""

    def now(self) -> float:
        return self._clock()

    def _hand_out(self, token: Token, where: str) -> Token:
        if token.expired(self.now()):
            raise ReboundError(
                FailureKind.SCHEDULER_AUTH,
                f"the slurmrestd token from {where} expired at {token.claims.expires()}: not sent (slurmrestd "
                f"would answer 'Unspecified error', like a controller outage). Fix {self.setting}.",
            )
        self.last = token
        return token


class StaticToken(TokenSource):
    """A token given once (``slurm.rest_token``): checked, never renewed."""

    def __init__(self, token: SecretStr, setting: str = "slurm.rest_token", clock: Callable[[], float] = time.time):
        super().__init__(setting, clock)
        value = token_from_text(token.get_secret_value())
        self._token = Token(SecretStr(value), read_claims(value, what=setting))
        self._warned = False

    async def get(self) -> Token:
        token = self._hand_out(self._token, self.setting)
        exp = token.claims.exp
        if exp is not None and not self._warned and exp - self.now() < 24 * 3600:
            self._warned = True  # once: the auth error says it again when it happens
            log.warning(
                "%s expires at %s and cannot be renewed: use slurm.rest_token_file or slurm.rest_token_lifespan_s",
                self.setting,
                token.claims.expires(),
            )
        return token


class TokenFile(TokenSource):
    """A file holding the token (``slurm.rest_token_file``), read again whenever it changes."""

    def __init__(self, path: Path, setting: str = "slurm.rest_token_file", clock: Callable[[], float] = time.time):
        super().__init__(f"{setting} ({path})", clock)
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token: Token | None = None

    @property
    def renewable(self) -> bool:
        return True  # whoever writes the file may have written a new one

    async def get(self) -> Token:
        try:
            st = await asyncio.to_thread(os.stat, self._path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._token is None or stamp != self._seen:
                if st.st_size > _MAX_TOKEN_BYTES:
                    raise ReboundError(
                        FailureKind.SCHEDULER_AUTH, f"{self.setting} holds {st.st_size} bytes: not a Slurm JWT"
                    )
                text = await asyncio.to_thread(self._path.read_text, "utf-8")
                value = token_from_text(text)
                self._token = Token(SecretStr(value), read_claims(value, what=self.setting))
                self._seen = stamp
        except (OSError, UnicodeDecodeError) as e:
            raise ReboundError(
                FailureKind.SCHEDULER_AUTH, f"cannot read the slurmrestd token: {e}. Fix {self.setting}."
            ) from e
        return self._hand_out(self._token, self.setting)

    def invalidate(self) -> None:
        self._seen = None  # read it again, even if it looks unchanged


class ScontrolToken(TokenSource):
    """A token made by ``scontrol token username=U lifespan=N``, renewed when a third of its life is left.

    Args:
        run: Runs ``scontrol`` with the given arguments (no shell): the CLI adapter, so ``SLURM_CONF`` and munge
            are the worker's own.
        user: ``username=``: the ``X-SLURM-USER-NAME`` the token is for. Asking for another user than the worker's
            own needs root or SlurmUser.
        lifespan_s: ``lifespan=`` in seconds.
    """

    def __init__(
        self,
        run: ScontrolRun,
        user: str,
        lifespan_s: int,
        setting: str = "slurm.rest_token_lifespan_s",
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(f"{setting} (scontrol token username={user} lifespan={lifespan_s})", clock)
        self._run = run
        self._user = user
        self._lifespan_s = lifespan_s
        self._token: Token | None = None
        self._lock = asyncio.Lock()
        self.renewals = 0
        """Tokens made so far (tests, logs)."""

    @property
    def renewable(self) -> bool:
        return True

    def _due(self, token: Token | None) -> bool:
        if token is None:
            return True
        if token.claims.exp is None:
            return False
        return token.claims.exp - self.now() <= self._lifespan_s / 3

    async def get(self) -> Token:
        async with self._lock:  # one renewal for every request that found the token due
            if self._due(self._token):
                self._token = await self._make()
            assert self._token is not None
            return self._hand_out(self._token, self.setting)

    def invalidate(self) -> None:
        self._token = None

    async def _make(self) -> Token:
        status, out, err = await self._run("token", f"username={self._user}", f"lifespan={self._lifespan_s}")
        value = token_from_text(out) if status == 0 else ""
        if not value:
            text = " ".join((err or out or f"exited {status}").split())[:500]
            kind = kind_from_text(text)
            if not kind.retryable:
                # Refused, not unreachable: JWT not enabled in slurm.conf, or this Unix user may not ask for U.
                kind = FailureKind.SCHEDULER_AUTH
            raise ReboundError(kind, f"scontrol token username={self._user} failed: {text}. Fix {self.setting}.")
        token = Token(SecretStr(value), read_claims(value, what="scontrol token's output"))
        self.renewals += 1
        log.info("slurmrestd token renewed for %s, expires %s", self._user, token.claims.expires())
        return token


class SlurmJwtAuth(httpx.Auth):
    """Sends the source's current token as ``X-SLURM-USER-TOKEN`` (and the user as ``X-SLURM-USER-NAME``).

    A 401 (no or unreadable token) is retried once with a renewed token when the source can renew it.
    """

    def __init__(self, source: TokenSource, user: str) -> None:
        self.source = source
        self.user = user

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        self._sign(request, await self.source.get())
        response = yield request
        if response.status_code == 401 and self.source.renewable:
            self.source.invalidate()
            self._sign(request, await self.source.get())
            yield request

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        # Never send a request unsigned through a sync client: the token source is async.
        raise RuntimeError("SlurmJwtAuth works with httpx.AsyncClient only")
        yield request  # pragma: no cover  # makes this a generator, as httpx expects

    def _sign(self, request: httpx.Request, token: Token) -> None:
        request.headers["X-SLURM-USER-NAME"] = self.user
        request.headers["X-SLURM-USER-TOKEN"] = token.value.get_secret_value()
