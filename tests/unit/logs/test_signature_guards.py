"""A row's guard (``activities.logs.signatures._GUARDS``) is true of every line its regex matches, proved from the
regex; and ``match`` with the guards (and with the chatter test skipped when no row is left) gives what it gave
before (``reference_signatures``, kept verbatim) on the test logs and on generated lines, alone and through the
crash reader."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs import crash
from activities.logs.line import decode
from activities.logs.signatures import _GUARDS, SIGNATURES, match, prepare
from tests.unit.logs import reference_signatures as old
from tests.unit.logs.line_corpus import corpus_lines, generated_lines
from tests.unit.logs.regex_proof import proved_in_order

_ORDER = {"loss_not_finite": (("loss",), ("nan", "inf"))}
"""What each guard tests, as texts in order (the first's first occurrence, then any of the second after it)."""


@pytest.mark.parametrize("row", sorted(_GUARDS))
def test_a_guard_holds_for_every_match_of_its_row(row: str) -> None:
    sig = next(s for s in SIGNATURES if s.id == row)
    # Case-sensitive as written: lower-casing the line maps what the regex matches onto the lower-case texts.
    assert not sig.pattern.flags & re.IGNORECASE and "(?i" not in sig.pattern.pattern
    assert proved_in_order(sig.pattern, _ORDER[row]), row
    assert set(_ORDER[row][0]) <= set(sig.hints)  # the guard looks after the hint that made the row a candidate


def test_the_loss_guard_reads_what_it_says() -> None:
    guard = _GUARDS["loss_not_finite"]
    assert not guard("[info] rank=3/8 node=g00001 step=120 loss=1.6129 step_time=1.000s compute_time=0.800s")
    assert guard("step 5 loss: nan") and guard("loss is inf") and guard("'loss': infinity")
    assert not guard("nan before the loss=0.5") and not guard("no l-o-s-s here, nan")


def _same(text: str) -> None:
    body = prepare(text).body
    assert match(body) == old.match(body), text


def test_matches_equal_the_old_code_on_the_test_logs() -> None:
    for text in corpus_lines():
        _same(text)


def test_matches_equal_the_old_code_on_generated_lines() -> None:
    for text in generated_lines():
        _same(text)


_WORDS = ["loss", "Loss", "LOSS", "loss_cls", "nan", "NaN", "NAN", "inf", "-inf", "Inf", "INF", "INFO", "Infinity",
          " is ", "=", ": ", "'", "tensor(", "iter 3: ", ", ", " ", "x", "ſ", "İ", "NCCL INFO ", "grad_norm",
          "became ", "contains a ", "step=5 "]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=10))
def test_matches_equal_the_old_code_on_loss_words(words: list[str]) -> None:
    _same("".join(words))


def test_the_crash_reader_finds_the_same_with_the_old_matcher(monkeypatch: pytest.MonkeyPatch) -> None:
    raws = [t.encode() for t in (*corpus_lines(), *generated_lines())]
    lines = [decode(f"/logs/rank-{i % 7}.log", None, None, i, raw) for i, raw in enumerate(raws)]
    new = crash.scan(lines)
    monkeypatch.setattr(crash, "match", old.match)
    assert crash.scan(lines) == new
    assert new  # the corpus has crashes: the comparison is not of two empty lists
