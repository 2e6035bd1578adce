"""Red team by fuzzing: what a job controls (its comment, its log lines) and what the scheduler answers go through
Rebound's parsers without a crash beyond their documented errors, and within a stated memory bound.

Documented errors: ``parse_comment`` raises only ``OptInError`` (a malformed spec); reading log lines never raises;
the scheduler's JSON parsers raise only ``ReboundError`` (``SCHEDULER_BAD_RESPONSE`` for what they cannot read, or
the kind the payload's own ``errors`` say). Memory: each example's peak allocation (tracemalloc) stays under
``PEAK_BYTES``; the inputs are at most a few KB, so anything near it would be a blow-up, not a big input.
"""

from __future__ import annotations

import copy
import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.logs.crash import scan
from activities.logs.job_watcher import progress_samples
from activities.logs.line import decode, decode_line
from activities.logs.signatures import match
from activities.logs.step_line import line_body, step_fields
from activities.slurm.parse import load_payload, parse_jobs, parse_nodes
from workflows.domain.errors import ReboundError
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import RecoverySpec, StragglerAction
from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.optin import KEYS, OptInError, parse_comment, spec_for

PEAK_BYTES = 8 * 1024 * 1024
"""The most one example may allocate at its peak (measured: well under 1 MB for any of them)."""
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
T = TypeVar("T")


@contextmanager
def _bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"peak {peak:,} bytes"


def _outcome(call: Callable[[], T], allowed: tuple[type[Exception], ...]) -> T | Exception:
    with _bounded_memory():
        try:
            return call()
        except allowed as e:
            return e


# ----- the comment spec -----------------------------------------------------------------------------------------

_VALUES = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"/[a-z*%/.]{0,30}", fullmatch=True),
    st.from_regex(r"[0-9]{1,12}(\.[0-9]{1,3})?[smh]?", fullmatch=True),
    st.sampled_from(["off", "report", "restart", "auto", "requeue", "resubmit", "quarantine", "/**", "-1", "1e9"]),
)
_PAIRS = st.lists(st.tuples(st.sampled_from([*KEYS, "BUDGET", "x", ""]), _VALUES), max_size=12)
_SEPARATORS = st.sampled_from([";", " ", ";;", ",", "|", "\t", "\n"])


@st.composite
def _comments(draw: st.DrawFn) -> str:
    """Comments shaped like opt-ins (most examples reach the key parser), or any text."""
    if draw(st.booleans()):
        return draw(st.text(max_size=200))
    sep = draw(_SEPARATORS)
    body = sep.join(f"{k}={v}" for k, v in draw(_PAIRS))
    return draw(st.sampled_from(["", "team=x; ", "x|", "rebound rebound "])) + "rebound:" + body


@FUZZ
@given(_comments())
def test_any_comment_parses_or_is_an_opt_in_error(comment: str) -> None:
    result = _outcome(lambda: parse_comment(comment), (OptInError,))
    assert result is None or isinstance(result, RecoverySpec | OptInError)
    if isinstance(result, OptInError):
        assert str(result).startswith("rebound")


_CAPS = st.builds(
    OptInCaps,
    max_budget=st.integers(0, 100),
    min_hang_s=st.floats(0, 3600),
    max_hang_s=st.floats(3600, 7 * 24 * 3600),
    stragglers=st.sampled_from(list(StragglerAction)),
    max_log_patterns=st.integers(0, 64),
    recursive_globs=st.booleans(),
)


@FUZZ
@given(_comments(), _CAPS)
def test_whatever_a_comment_asks_the_spec_stays_under_the_ceilings(comment: str, caps: OptInCaps) -> None:
    job = SlurmJob(job_id=1, name="j", user="u", state=JobState.RUNNING, comment=comment)
    spec = _outcome(lambda: spec_for(job, [], caps), (OptInError,))
    if not isinstance(spec, RecoverySpec):
        return
    order = [StragglerAction.OFF, StragglerAction.REPORT, StragglerAction.RESTART]
    assert spec.restart_budget <= caps.max_budget
    assert spec.hang_after_s is None or caps.min_hang_s <= spec.hang_after_s <= caps.max_hang_s
    assert order.index(spec.stragglers) <= order.index(caps.stragglers)
    for globs in (spec.logs, spec.heartbeat):
        assert len(globs) <= caps.max_log_patterns
        assert caps.recursive_globs or not any("**" in g.split("/") for g in globs)


# ----- log lines ----------------------------------------------------------------------------------------------

_PREFIXES = st.sampled_from(
    [
        b"",
        b"0: ",
        b"[rank7]: ",
        b"2026-12-06T01:02:03.456Z ",
        b"2026-13-99 99:99:99 ",
        b"[default3]:",
        b"rank=99999999999999999999 step=",
        b"step=18446744073709551617 ",
        b"Epoch 3:  45%|####5     | 450/1000 [",
        b"NCCL WARN ",
        b"Xid 79 ",
        b"RuntimeError: CUDA error: ",
    ]
)
_RAW = st.tuples(_PREFIXES, st.binary(max_size=300), _PREFIXES).map(lambda t: b"".join(t))
_READ_AT = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


@FUZZ
@given(st.lists(_RAW, min_size=1, max_size=20), st.one_of(st.none(), st.integers(0, 2**40)))
def test_any_log_line_is_read_without_raising(raws: list[bytes], file_rank: int | None) -> None:
    def read() -> int:
        lines = [decode("/j/r.log", file_rank, None, i * 400, raw) for i, raw in enumerate(raws)]
        models = [decode_line("/j/r.log", file_rank, None, i * 400, raw) for i, raw in enumerate(raws)]
        found = scan(lines)
        for model in models:
            body = line_body(model.text)
            step_fields(body)
            match(body)
        samples = progress_samples(lines, _READ_AT, {})
        return len(found) + len(samples)

    result = _outcome(read, ())
    assert isinstance(result, int)


# ----- the scheduler's JSON -----------------------------------------------------------------------------------

_JSON: Any = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=30),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)


def _sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


SQUEUE, SINFO = _sample("squeue.json"), _sample("sinfo.json")


@st.composite
def _mutated(draw: st.DrawFn, base: dict[str, Any], key: str) -> dict[str, Any]:
    """A real payload with a few of its first entry's fields replaced, removed, or the entry list mangled."""
    payload = copy.deepcopy(base)
    entries = payload[key]
    entry = entries[draw(st.integers(0, len(entries) - 1))]
    for field in draw(st.lists(st.sampled_from(sorted(entry)), max_size=6)):
        if draw(st.booleans()):
            entry[field] = draw(_JSON)
        else:
            entry.pop(field, None)
    if draw(st.integers(0, 9)) == 0:
        payload[key] = draw(_JSON)
    if draw(st.integers(0, 9)) == 0:
        payload["errors"] = draw(_JSON)
    return payload


@FUZZ
@given(_mutated(SQUEUE, "jobs"))
def test_any_squeue_payload_parses_or_is_a_rebound_error(payload: dict[str, Any]) -> None:
    result = _outcome(lambda: parse_jobs(payload), (ReboundError,))
    assert isinstance(result, tuple | ReboundError)


@FUZZ
@given(_mutated(SINFO, "nodes"))
def test_any_sinfo_payload_parses_or_is_a_rebound_error(payload: dict[str, Any]) -> None:
    result = _outcome(lambda: parse_nodes(payload), (ReboundError,))
    assert isinstance(result, tuple | ReboundError)


@FUZZ
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400), _JSON.map(json.dumps)))
def test_any_scheduler_output_loads_or_is_a_rebound_error(raw: bytes | str) -> None:
    result = _outcome(lambda: load_payload(raw, source="squeue --json"), (ReboundError,))
    assert isinstance(result, dict | ReboundError)
