"""Parsing of the lab's rank and batch logs and of ``sinfo`` for `rebound bench recovery` (pure)."""

from __future__ import annotations

from deploy.bench.labparse import batch_starts, parse_rank_log, parse_sinfo_nodes, rebound_drained
from tests.unit.bench.builders import BATCH_LOG, RANK0_LOG, at


def test_parse_rank_log_splits_attempts() -> None:
    attempts = parse_rank_log(RANK0_LOG)
    assert [a.restart for a in attempts] == [0, 1]
    assert (attempts[0].resumed_step, attempts[0].first_step, attempts[0].last_step) == (0, 1, 32)
    assert attempts[0].saved_steps == (20,)
    assert (attempts[1].resumed_step, attempts[1].first_step, attempts[1].first_step_at) == (20, 21, at(14))


def test_batch_starts() -> None:
    assert batch_starts(BATCH_LOG) == {0: at(-11), 1: at(7.5)}


def test_sinfo_rows_and_this_jobs_rebound_drains() -> None:
    text = "n1|idle|none\nn2|drained|rebound: 12-1 rank-crash\nn2|drained|rebound: 12-1 rank-crash\n"
    text += "n3|drained|rebound: 120-1 xid-79\nn4|down|Not responding\n"
    rows = parse_sinfo_nodes(text)
    assert [r.node for r in rows] == ["n1", "n2", "n3", "n4"]
    assert rows[0].reason == ""
    assert rebound_drained(rows, 12) == ["n2"]
