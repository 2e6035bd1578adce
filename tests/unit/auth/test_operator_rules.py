"""The pure rules of operators' authentication (``workflows.policy.operators``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.domain.auth_state import AuthState
from workflows.domain.fleet import FleetMode
from workflows.domain.operators import (
    OperatorAction,
    OperatorActionKind,
    OperatorCredential,
    OperatorRequest,
    VerifiedCaller,
)
from workflows.policy import operators as rules

NOW = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


def req(kind: OperatorActionKind = OperatorActionKind.BREAKER_RESET, *, munge: str = "MUNGE:abc:", age_s: float = 1,
        claimed: str = "alice", **fields: object) -> OperatorRequest:  # fmt: skip
    action = OperatorAction(kind=kind, cluster="lab", nonce="n" * 16, **fields)
    cred = OperatorCredential(munge=munge, claimed_user=claimed, encoded_at=NOW - timedelta(seconds=age_s))
    return OperatorRequest(action=action, credential=cred)


def verified(user: str = "alice", groups: tuple[str, ...] = ("alice",), operators: tuple[str, ...] = ("alice",),
             age_s: float = 1) -> VerifiedCaller:  # fmt: skip
    return VerifiedCaller(
        ok=True, user=user, uid=1001, groups=groups, encoded_at=NOW - timedelta(seconds=age_s), operators=operators
    )


def test_the_payload_binds_every_field_of_the_action() -> None:
    a = OperatorAction(kind=OperatorActionKind.APPROVE, cluster="lab", approval_id="a-1", nonce="x" * 16)
    payloads = {
        rules.action_payload(a),
        rules.action_payload(a.model_copy(update={"approval_id": "a-2"})),
        rules.action_payload(a.model_copy(update={"kind": OperatorActionKind.REJECT})),
        rules.action_payload(a.model_copy(update={"cluster": "other"})),
        rules.action_payload(a.model_copy(update={"nonce": "y" * 16})),
    }
    assert len(payloads) == 5
    assert rules.action_payload(a) == rules.action_payload(OperatorAction.model_validate(a.model_dump()))


def test_operators_are_users_or_groups_and_an_empty_list_is_nobody() -> None:
    assert rules.is_operator("alice", ("staff",), ("alice",))
    assert rules.is_operator("bob", ("staff", "hpc-ops"), ("%hpc-ops",))
    assert not rules.is_operator("bob", ("staff",), ("%hpc-ops", "alice"))
    assert not rules.is_operator("hpc-ops", (), ("%hpc-ops",))  # a user named like the group is not the group
    assert not rules.is_operator("alice", ("alice",), ())
    assert not rules.is_operator("", (), ("",))


def test_precheck_refuses_what_it_can_see_without_decoding() -> None:
    auth = AuthState()
    assert rules.precheck(auth, req(), NOW) is None
    assert "not a MUNGE credential" in (rules.precheck(auth, req(munge="forged"), NOW) or "")
    assert "old" in (rules.precheck(auth, req(age_s=rules.MAX_CREDENTIAL_AGE_S + 1), NOW) or "")
    assert "future" in (rules.precheck(auth, req(age_s=-rules.CLOCK_SKEW_S - 5), NOW) or "")
    used = rules.note_presented(auth, req(), NOW)
    assert "replay" in (rules.precheck(used, req(), NOW) or "")


def test_used_credentials_are_forgotten_only_once_too_old_to_pass() -> None:
    auth = rules.note_presented(AuthState(), req(munge="MUNGE:one:"), NOW)
    later = NOW + timedelta(seconds=rules.MAX_CREDENTIAL_AGE_S + 3 * rules.CLOCK_SKEW_S)
    auth = rules.note_presented(auth, req(munge="MUNGE:two:", age_s=-later.timestamp() + NOW.timestamp()), later)
    assert list(auth.used) == [rules.credential_digest("MUNGE:two:")]


def test_failed_attempts_are_rate_limited_per_caller_and_in_total() -> None:
    auth = AuthState()
    bad = VerifiedCaller(ok=False, reason="unmunge: Invalid credential (6)")
    for i in range(rules.REFUSALS_PER_CALLER):
        r = req(munge=f"MUNGE:m{i}:", claimed="mallory")
        auth = rules.note_outcome(auth, r, bad, "did not verify", NOW)
    assert "mallory" in (rules.precheck(auth, req(munge="MUNGE:next:", claimed="mallory"), NOW) or "")
    assert rules.precheck(auth, req(munge="MUNGE:next:", claimed="alice"), NOW) is None
    for i in range(rules.REFUSALS_TOTAL):
        auth = rules.note_outcome(auth, req(munge=f"MUNGE:x{i}:", claimed=f"u{i}"), bad, "no", NOW)
    assert "failed verifications" in (rules.precheck(auth, req(munge="MUNGE:z:", claimed="alice"), NOW) or "")
    after = NOW + timedelta(seconds=rules.REFUSAL_WINDOW_S + 1)
    assert rules.precheck(auth, req(munge="MUNGE:z:", claimed="alice", age_s=-rules.REFUSAL_WINDOW_S), after) is None


def test_an_operator_refused_for_a_stale_approval_is_not_counted_as_forgery() -> None:
    auth = rules.note_outcome(AuthState(), req(), verified(), "approval a-1 is not pending", NOW)
    assert auth.refusals == () and auth.events[-1].allowed is False


def test_authorize_decides_from_the_verified_user_not_the_claim() -> None:
    r = req(claimed="alice")
    assert rules.authorize(verified(), r, NOW) is None
    refusal = rules.authorize(verified(user="mallory", groups=("mallory",)), r, NOW) or ""
    assert "mallory is not an operator" in refusal
    assert "did not verify" in (rules.authorize(VerifiedCaller(ok=False, reason="Replayed"), r, NOW) or "")
    assert "encoded" in (rules.authorize(verified(age_s=rules.MAX_CREDENTIAL_AGE_S + 60), r, NOW) or "")
    assert "claimed encode time" in (rules.authorize(verified(age_s=1), req(age_s=100), NOW) or "")
    nobody = rules.authorize(verified(operators=()), r, NOW) or ""
    assert "fleet.operators is empty" in nobody


def test_a_changed_operator_list_is_recorded_once() -> None:
    auth = rules.note_outcome(AuthState(), req(), verified(operators=("alice",)), None, NOW)
    assert [e.action for e in auth.events] == ["breaker-reset"]
    auth = rules.note_outcome(auth, req(munge="MUNGE:2:"), verified(operators=("alice", "%ops")), None, NOW)
    change = [e for e in auth.events if e.action == "operators-changed"]
    assert len(change) == 1 and "added: %ops" in change[0].detail
    auth = rules.note_outcome(auth, req(munge="MUNGE:3:"), verified(operators=("alice", "%ops")), None, NOW)
    assert len([e for e in auth.events if e.action == "operators-changed"]) == 1


def test_the_audit_names_the_action() -> None:
    r = req(OperatorActionKind.MODE, mode=FleetMode.OBSERVE)
    auth = rules.note_outcome(AuthState(), r, verified(), None, NOW)
    assert auth.events[-1].action == "mode observe" and auth.events[-1].user == "alice"
    bad = rules.note_outcome(AuthState(), r, VerifiedCaller(ok=False, reason="x"), "did not verify", NOW)
    assert bad.events[-1].user == "claimed:alice"
