"""The verification activity against a real munged: success, replay, expiry, another action's payload, forgery,
and a non-operator's real credential."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from activities.auth.unmunge import parse_unmunge
from tests.munge_support import MungeLab
from workflows.domain.operators import OperatorCredential, VerifyCredentialInput

#: unmunge's output for a replayed credential, as Debian's munge 0.5.15 prints it (recorded on the lab).
REPLAYED = """STATUS:          Replayed credential (17)
ENCODE_HOST:     localhost (127.0.0.1)
ENCODE_TIME:     2026-12-06 02:38:27 +0000 (1796524707)
DECODE_TIME:     2026-12-06 02:38:27 +0000 (1796524707)
TTL:             300
CIPHER:          aes128 (4)
MAC:             sha256 (5)
ZIP:             none (0)
UID:             root (0)
GID:             root (0)
LENGTH:          11

hello
world"""


def test_unmunge_output_is_read_field_by_field_and_a_replay_is_not_a_success() -> None:
    r = parse_unmunge(REPLAYED)
    assert (r.status, r.status_code, r.uid, r.gid, r.user) == ("Replayed credential", 17, 0, 0, "root")
    assert r.encoded_at == datetime.fromtimestamp(1796524707, UTC)
    assert r.payload == "hello\nworld" and not r.success
    with pytest.raises(ValueError, match="STATUS"):
        parse_unmunge("unmunge: Error: Failed to base64-decode credential\n")


def _input(lab: MungeLab, payload: str, *, user: str | None = None, ttl: int | None = None) -> VerifyCredentialInput:
    cred = OperatorCredential(
        munge=lab.encode(payload, user=user, ttl=ttl), claimed_user=user or "root", encoded_at=datetime.now(UTC)
    )
    return VerifyCredentialInput(credential=cred, payload=payload)


async def test_a_fresh_credential_verifies_once(munge_lab: MungeLab) -> None:
    verifier = munge_lab.verifier(["root"])
    inp = _input(munge_lab, "rebound-operator-action/v1\n{}")
    first = await verifier.check(inp)
    assert first.ok and first.user == "root" and first.uid == 0 and "root" in first.groups
    assert first.operators == ("root",)
    assert first.encoded_at is not None and abs(first.encoded_at - datetime.now(UTC)) < timedelta(seconds=5)
    again = await verifier.check(inp)
    assert not again.ok and "Replayed credential" in again.reason


async def test_a_credential_for_another_payload_is_refused(munge_lab: MungeLab) -> None:
    inp = _input(munge_lab, "approve a-1")
    other = inp.model_copy(update={"payload": "approve a-2"})
    result = await munge_lab.verifier(["root"]).check(other)
    assert not result.ok and "another action" in result.reason


async def test_an_expired_credential_is_refused_whatever_it_names(munge_lab: MungeLab) -> None:
    import asyncio

    inp = _input(munge_lab, "x", ttl=1)
    await asyncio.sleep(2.2)
    result = await munge_lab.verifier(["root"]).check(inp)
    assert not result.ok and "Expired" in result.reason


async def test_garbage_and_a_dead_munged_are_refusals_not_crashes(munge_lab: MungeLab, tmp_path: object) -> None:
    forged = VerifyCredentialInput(
        credential=OperatorCredential(munge="MUNGE:AAAA:", claimed_user="root", encoded_at=datetime.now(UTC)),
        payload="x",
    )
    result = await munge_lab.verifier(["root"]).check(forged)
    assert not result.ok and "unmunge refused it" in result.reason
    from activities.auth.munge import MungeVerifier

    dead = MungeVerifier(unmunge_bin="unmunge", socket=munge_lab.socket.with_name("gone"), timeout_s=5,
                         operators=lambda: ("root",))  # fmt: skip
    assert not (await dead.check(_input(munge_lab, "y"))).ok


async def test_a_non_operators_real_credential_names_them(munge_lab: MungeLab) -> None:
    inp = _input(munge_lab, "reset", user="nobody")
    result = await munge_lab.verifier(["root"]).check(inp)
    assert result.ok and result.user == "nobody" and result.uid == 65534
    assert "root" not in result.groups


async def test_a_broken_operator_list_fails_closed(munge_lab: MungeLab) -> None:
    from activities.auth.munge import MungeVerifier

    def broken() -> tuple[str, ...]:
        raise ValueError("rebound.toml: bad TOML")

    verifier = MungeVerifier(unmunge_bin="unmunge", socket=munge_lab.socket, timeout_s=5, operators=broken)
    result = await verifier.check(_input(munge_lab, "z"))
    assert not result.ok and "operator list could not be read" in result.reason


def test_the_munge_key_is_never_readable_by_others(munge_lab: MungeLab) -> None:
    key = munge_lab.socket.with_name("munge.key")
    out = subprocess.run(
        ["runuser", "-u", "nobody", "--", "cat", str(key)], capture_output=True, text=True, check=False
    )
    assert out.returncode != 0
