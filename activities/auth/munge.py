"""Verify an operator's MUNGE credential on the worker's host, and sign one on the CLI's.

``unmunge`` decodes with the cluster's key through the local munged: STATUS ``Success`` means the credential was
made by munged with that key, is within its TTL and was not seen before by this host's munged. The UID it names
is resolved to a user and its groups here, and the operator list is read at this moment (live configuration:
a changed ``fleet.operators`` in the TOML file applies to the next action, without restarting anything).
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.auth.unmunge import parse_unmunge
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.operators import VerifiedCaller, VerifyCredentialInput

__all__ = ["MungeVerifier", "encode_credential", "unix_groups"]


async def _run(argv: list[str], stdin: str, timeout_s: float) -> tuple[int, str, str]:
    """Run a program with an argument list (never a shell), ``stdin`` as its input."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def unix_groups(user: str, gid: int) -> tuple[str, ...]:
    """The user's groups (primary and supplementary) by name, as this host resolves them."""
    names = []
    for g in os.getgrouplist(user, gid):
        try:
            names.append(grp.getgrgid(g).gr_name)
        except KeyError:
            continue  # a GID without a name cannot match a ``%group`` entry
    return tuple(sorted(set(names)))


class MungeVerifier:
    """The ``verify_operator_credential`` activity: one ``unmunge`` run per credential, never retried."""

    def __init__(
        self, *, unmunge_bin: str, socket: Path, timeout_s: float, operators: Callable[[], tuple[str, ...]]
    ) -> None:
        self._unmunge = unmunge_bin
        self._socket = socket
        self._timeout_s = timeout_s
        self._operators = operators

    @activity.defn(name="verify_operator_credential")
    async def verify(self, inp: VerifyCredentialInput) -> VerifiedCaller:
        return await self.check(inp)

    async def check(self, inp: VerifyCredentialInput) -> VerifiedCaller:
        """What the credential proves; ``ok`` false with the reason when it proves nothing."""
        argv = [self._unmunge, f"--socket={self._socket}"]
        try:
            code, out, err = await _run(argv, inp.credential.munge.strip() + "\n", self._timeout_s)
        except (OSError, TimeoutError) as e:
            return VerifiedCaller(ok=False, reason=f"unmunge could not run ({type(e).__name__}: {e})")
        try:
            decoded = parse_unmunge(out)
        except ValueError as e:
            detail = err.strip().splitlines()[-1] if err.strip() else str(e)
            return VerifiedCaller(ok=False, reason=f"unmunge refused it (exit {code}): {detail}")
        if not decoded.success:
            return VerifiedCaller(ok=False, reason=f"unmunge: {decoded.status} ({decoded.status_code})")
        if decoded.payload != inp.payload:
            return VerifiedCaller(ok=False, reason="the credential was made for another action (payload differs)")
        if decoded.uid is None or decoded.gid is None or decoded.encoded_at is None:
            return VerifiedCaller(ok=False, reason="unmunge printed no UID, GID or ENCODE_TIME")
        try:
            entry = pwd.getpwuid(decoded.uid)
        except KeyError:
            return VerifiedCaller(ok=False, reason=f"UID {decoded.uid} has no user on the verifying host")
        try:
            operators = self._operators()
        except Exception as e:  # a broken config file: nobody is an operator until it is fixed (fail closed)
            return VerifiedCaller(ok=False, reason=f"the operator list could not be read: {e}")
        return VerifiedCaller(
            ok=True,
            user=entry.pw_name,
            uid=decoded.uid,
            groups=unix_groups(entry.pw_name, decoded.gid),
            encoded_at=decoded.encoded_at,
            operators=operators,
        )


async def encode_credential(payload: str, *, munge_bin: str, socket: Path, timeout_s: float) -> tuple[str, datetime]:
    """A MUNGE credential over ``payload`` (the CLI's side), and when it was made."""
    at = datetime.now(UTC)
    argv = [munge_bin, f"--socket={socket}"]
    try:
        code, out, err = await _run(argv, payload, timeout_s)
    except (OSError, TimeoutError) as e:
        raise ReboundError(FailureKind.CONFIGURATION, f"munge could not run ({e}): is MUNGE installed?") from e
    if code != 0 or not out.strip().startswith("MUNGE:"):
        raise ReboundError(
            FailureKind.CONFIGURATION,
            f"munge failed (exit {code}): {err.strip() or out.strip()} (auth.munge_socket = {socket})",
        )
    return out.strip(), at
