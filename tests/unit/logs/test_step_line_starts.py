"""The step parser's searches from a rule's needed text (``StepRule.starts``, ``StepTimeRule.starts``): each flag is
proved from its regex, and the readings equal the code before the change (``reference_step_line``, kept verbatim)
on the test logs and on generated lines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs.progress_rules import STEP_RULES, STEP_TIME_RULES, StepRule, StepTimeRule
from activities.logs.step_line import line_body, parse_step_times, step_fields
from tests.unit.logs import reference_step_line as old
from tests.unit.logs.line_corpus import corpus_lines, generated_lines
from tests.unit.logs.regex_proof import proved_start
from tests.unit.logs.test_step_line import PIECES


@pytest.mark.parametrize("rule", STEP_RULES, ids=lambda r: r.name)
def test_a_starting_step_rule_begins_every_match_with_its_needs(rule: StepRule) -> None:
    assert not rule.starts or proved_start(rule.pattern, (rule.needs,)), rule.name


@pytest.mark.parametrize("rule", STEP_TIME_RULES, ids=lambda r: r.name)
def test_a_starting_time_rule_begins_every_match_with_one_of_its_needs(rule: StepTimeRule) -> None:
    assert not rule.starts or (rule.needs and proved_start(rule.pattern, rule.needs)), rule.name


def test_the_proof_says_no_where_a_match_may_start_elsewhere() -> None:
    bar = next(r for r in STEP_TIME_RULES if r.name == "bar_rate")
    tqdm = next(r for r in STEP_RULES if r.name == "tqdm_bar")
    assert not bar.starts and not proved_start(bar.pattern, bar.needs)
    assert not tqdm.starts and not proved_start(tqdm.pattern, (tqdm.needs,))


def _plain(value: tuple[object, ...] | None) -> tuple[object, ...] | None:
    """A reading as a plain tuple (the reference module has its own NamedTuple classes)."""
    return None if value is None else tuple(value)


def _same(body: str) -> None:
    assert _plain(step_fields(body)) == _plain(old.step_fields(body)), body
    for rule in STEP_RULES:
        new, was = parse_step_times(rule.name, body), old.parse_step_times(rule.name, body)
        assert _plain(new) == _plain(was), (rule.name, body)


def test_readings_equal_the_old_code_on_the_test_logs() -> None:
    for text in corpus_lines():
        _same(line_body(text))


def test_readings_equal_the_old_code_on_generated_lines() -> None:
    for text in generated_lines():
        _same(line_body(text))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=6))
def test_readings_equal_the_old_code_on_mixed_pieces(pieces: list[str]) -> None:
    _same(line_body("".join(pieces)))
