"""Opt-in: the ``rebound`` comment grammar, operator selectors and which of them wins. Pure, no Temporal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from workflows.domain.recovery import RecoverySpec
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.optin import JobSelector, OptInError, UnsupportedJob, parse_comment, select, spec_for

FULL = "rebound: ckpt=/ckpt/run1;budget=3;policy=default;logs=/runs/x/logs/job-%j-rank-*.log"


def _job(comment: str = "", *, name: str = "llm-7b", user: str = "alice", partition: str = "gpu") -> SlurmJob:
    return SlurmJob(job_id=7, name=name, user=user, partition=partition, state=JobState.RUNNING, comment=comment)


# ----- parse_comment: accepted forms ------------------------------------------------------------------------


def test_full_spec() -> None:
    spec = parse_comment(FULL)
    assert spec == RecoverySpec(
        checkpoint_dir="/ckpt/run1", restart_budget=3, policy="default", logs=("/runs/x/logs/job-%j-rank-*.log",)
    )


@pytest.mark.parametrize(
    "comment",
    [
        "rebound: ckpt=/c budget=2",  # whitespace separates pairs too
        "rebound:ckpt=/c;budget=2",
        "rebound : ckpt=/c ; budget=2 ;",
        "team=nlp; rebound: ckpt=/c;budget=2",  # other text before
        "owner alice rebound: ckpt=/c budget=2",
        "rebound: ckpt=/c budget=2 | owner: alice",  # other text after a '|'
        "rebound: CKPT=/c Budget=2",  # keys are case-insensitive
    ],
)
def test_accepted_layouts(comment: str) -> None:
    assert parse_comment(comment) == RecoverySpec(checkpoint_dir="/c", restart_budget=2)


def test_logs_repeat_and_comma_separate_in_order() -> None:
    spec = parse_comment("rebound: logs=/a/*.log,/b/*.log logs=/c/%j-*.out")
    assert spec is not None
    assert spec.logs == ("/a/*.log", "/b/*.log", "/c/%j-*.out")


@pytest.mark.parametrize(
    "comment", ["rebound", "  rebound  ", "rebound:", "rebound: ", "team=nlp; rebound", "rebound | x"]
)
def test_bare_marker_opts_in_with_defaults(comment: str) -> None:
    spec = parse_comment(comment)
    assert spec == RecoverySpec()
    assert spec is not None and spec.model_fields_set == set()  # nothing given: nothing overrides a selector


def test_only_given_keys_are_marked_set() -> None:
    spec = parse_comment("rebound: budget=0")
    assert spec is not None
    assert spec.restart_budget == 0
    assert spec.model_fields_set == {"restart_budget"}


@pytest.mark.parametrize(
    "comment",
    [
        "",
        "some text about a run",
        "tested the rebound fix",  # the word in prose is not an opt-in
        "see /opt/rebound/README",
        "rebounded: yes",
        "norebound: budget=3",
        "policy=rebound",
    ],
)
def test_no_opt_in(comment: str) -> None:
    assert parse_comment(comment) is None


def test_prose_before_a_real_marker_is_skipped() -> None:
    assert parse_comment("after the rebound fix; rebound: budget=4") == RecoverySpec(restart_budget=4)


# ----- parse_comment: errors name the key -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comment", "key", "words"),
    [
        ("rebound: budget=lots", "budget", "whole number"),
        ("rebound: budget=-1", "budget", "whole number"),
        ("rebound: budget=101", "budget", "100"),
        ("rebound: budget=", "budget", "empty"),
        ("rebound: budget=1 budget=2", "budget", "more than once"),
        ("rebound: ckpt=relative/dir", "ckpt", "absolute"),
        ("rebound: logs=/ok,relative.log", "logs", "absolute"),
        ("rebound: policy=no spaces!", "spaces!", "key=value"),
        ("rebound: policy=9lives", "policy", "policy name"),
        ("rebound: retries=3", "retries", "unknown key"),
        ("rebound: =3", "=3", "key=value"),
        ("rebound: budget", "budget", "key=value"),
        ("rebound budget=3", "rebound", "colon"),
        ("rebound;budget=3", "rebound", "colon"),
    ],
)
def test_malformed_spec_raises_naming_the_key(comment: str, key: str, words: str) -> None:
    with pytest.raises(OptInError) as err:
        parse_comment(comment)
    assert err.value.key == key
    assert words in str(err.value)
    assert isinstance(err.value, ValueError)


_PIECES = ["rebound", "rebound:", ":", " ", ";", ",", "|", "budget=", "3", "ckpt=", "/c", "logs=", "x", "=", "policy="]


@given(st.text(max_size=80) | st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))
def test_any_comment_parses_or_raises_opt_in_error(comment: str) -> None:
    try:
        spec = parse_comment(comment)
    except OptInError:
        return
    assert spec is None or isinstance(spec, RecoverySpec)


@given(
    budget=st.integers(0, 100),
    ckpt=st.from_regex(r"/[a-z0-9_/.-]{0,20}", fullmatch=True),
    prefix=st.sampled_from(["", "team=nlp; ", "note "]),
    sep=st.sampled_from([";", " ", " ; "]),
)
def test_round_trip(budget: int, ckpt: str, prefix: str, sep: str) -> None:
    spec = parse_comment(f"{prefix}rebound: budget={budget}{sep}ckpt={ckpt}")
    assert spec == RecoverySpec(restart_budget=budget, checkpoint_dir=ckpt)


# ----- selectors ---------------------------------------------------------------------------------------------

GPU = JobSelector(partitions=("gpu",), spec=RecoverySpec(restart_budget=1, checkpoint_dir="/sel"))


def test_selector_criteria_are_anded() -> None:
    sel = JobSelector(partitions=("gpu",), users=("alice",), name_regex=r"llm-.*")
    assert sel.matches(_job())
    assert not sel.matches(_job(user="bob"))
    assert not sel.matches(_job(partition="cpu"))
    assert not sel.matches(_job(name="vision-llm-7b"))  # the whole name must match


def test_selector_matches_any_of_a_pending_jobs_partitions() -> None:
    assert GPU.matches(_job(partition="cpu,gpu"))


def test_empty_selector_matches_everything() -> None:
    assert JobSelector().matches(_job(name="", user="", partition=""))


def test_selector_rejects_bad_regex_and_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="regular expression"):
        JobSelector(name_regex="llm-(")
    with pytest.raises(ValidationError):
        JobSelector.model_validate({"partition": ["gpu"]})  # typo: partitions


def test_first_matching_selector_wins() -> None:
    other = JobSelector(users=("alice",), spec=RecoverySpec(restart_budget=9))
    assert select(_job(), [GPU, other]) == GPU.spec
    assert select(_job(), [other, GPU]) == other.spec
    assert select(_job(partition="cpu", user="bob"), [GPU, other]) is None


# ----- spec_for: comment + selectors -------------------------------------------------------------------------


def test_neither_opted_in_nor_selected_is_left_alone() -> None:
    assert spec_for(_job("just a note"), []) is None
    assert spec_for(_job("just a note", partition="cpu"), [GPU]) is None


def test_selected_job_gets_the_selectors_spec() -> None:
    assert spec_for(_job(), [GPU]) == GPU.spec


def test_comment_alone() -> None:
    assert spec_for(_job("rebound: budget=2"), []) == RecoverySpec(restart_budget=2)


def test_comment_wins_key_by_key_over_the_selector() -> None:
    spec = spec_for(_job("rebound: ckpt=/own"), [GPU])
    assert spec == RecoverySpec(restart_budget=1, checkpoint_dir="/own")  # the budget from the selector
    spec = spec_for(_job("rebound: budget=4"), [GPU])  # the selector's budget is a ceiling (optin_caps)
    assert spec is not None and spec.restart_budget == 1 and spec.checkpoint_dir == "/sel"
    assert spec_for(_job("rebound"), [GPU]) == GPU.spec  # a bare opt-in overrides nothing


def test_malformed_comment_is_not_overruled_by_a_selector() -> None:
    with pytest.raises(OptInError):
        spec_for(_job("rebound: budget=O"), [GPU])


@pytest.mark.parametrize(
    ("value", "seconds"), [("600", 600.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("2.5m", 150.0)]
)
def test_hang_window_takes_a_duration(value: str, seconds: float) -> None:
    spec = parse_comment(f"rebound: hang={value}")
    assert spec is not None
    assert spec.hang_after_s == seconds


@pytest.mark.parametrize("comment", ["rebound: hang=5x", "rebound: hang=-1", "rebound: hang=0", "rebound: hang=1d"])
def test_bad_hang_window_names_the_key(comment: str) -> None:
    with pytest.raises(OptInError, match="hang"):
        parse_comment(comment)


def test_heartbeat_globs_and_straggler_action() -> None:
    spec = parse_comment("rebound: heartbeat=/runs/a/%j-*.hb,/runs/b/*.hb stragglers=RESTART")
    assert spec is not None
    assert spec.heartbeat == ("/runs/a/%j-*.hb", "/runs/b/*.hb")
    assert spec.stragglers.value == "restart"
    assert spec.logs == ()
    with pytest.raises(OptInError, match="stragglers"):
        parse_comment("rebound: stragglers=kill")
    with pytest.raises(OptInError, match="heartbeat"):
        parse_comment("rebound: heartbeat=relative/*.hb")


def test_a_heterogeneous_job_that_opted_in_is_reported_unsupported() -> None:
    component = SlurmJob(job_id=5, state=JobState.RUNNING, comment="rebound: budget=2", het_job_id=4, het_job_offset=1)
    with pytest.raises(UnsupportedJob, match=r"heterogeneous job \(component \+1 of 4\), not watched"):
        spec_for(component, [])
    assert isinstance(UnsupportedJob("x"), OptInError)  # discovery reports it with the malformed opt-ins
    selected = component.model_copy(update={"comment": ""})
    with pytest.raises(UnsupportedJob):
        spec_for(selected, [JobSelector()])  # a selector without criteria matches every job
    assert spec_for(selected, []) is None  # not opted in: left alone without a word
