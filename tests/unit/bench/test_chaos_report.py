"""``rebound bench chaos``: its rows, table, report and scenario selection (pure; the lab runs are in
``tests/e2e/test_chaos.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from deploy.bench.chaos import SCENARIOS, TESTS, parse_scenarios, pytest_argv
from deploy.bench.chaos_report import RESULTS_ENV, ChaosRow, chaos_report, chaos_table, read_rows, record_row
from workers import cli

OK = ChaosRow(scenario="slurmctld down, job watched", outage_s=15.2, false_actions=0, recovered=True, time_s=17.9)
BAD = ChaosRow(scenario="drain storm (3 of 4 nodes)", outage_s=0, false_actions=1, recovered=True, time_s=6.0)


def test_rows_go_to_the_results_file_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rows.jsonl"
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    record_row(OK)
    assert not out.exists()
    monkeypatch.setenv(RESULTS_ENV, str(out))
    record_row(OK)
    record_row(BAD)
    with out.open("a") as f:
        f.write('{"scenario": "torn')  # a test killed mid-write
    assert read_rows(out) == [OK, BAD]
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_the_table_has_one_line_per_scenario_with_its_numbers() -> None:
    lines = chaos_table([OK, BAD]).splitlines()
    assert lines[0].split() == ["scenario", "outage", "false", "actions", "recovered", "time"]
    assert lines[2].split()[-4:] == ["15.2s", "0", "yes", "17.9s"]
    assert lines[3].split()[-4:] == ["0.0s", "1", "yes", "6.0s"]


def test_the_report_passes_only_with_every_row_clean_and_pytest_green() -> None:
    assert chaos_report([OK], outage_s=60, exit_code=0)["passed"] is True
    assert chaos_report([OK, BAD], outage_s=60, exit_code=0)["passed"] is False  # a false action
    assert chaos_report([OK], outage_s=60, exit_code=1)["passed"] is False  # a test failed
    assert chaos_report([], outage_s=60, exit_code=0)["passed"] is False  # nothing ran
    lost = OK.model_copy(update={"recovered": False})
    report = chaos_report([lost], outage_s=60, exit_code=0)
    assert report["passed"] is False and report["rows"][0]["scenario"] == OK.scenario


def test_scenarios_select_their_tests_in_order() -> None:
    assert parse_scenarios(None) == list(SCENARIOS)
    assert parse_scenarios("storm, ctld-watch") == ["storm", "ctld-watch"]
    with pytest.raises(ValueError, match="unknown scenario"):
        parse_scenarios("storm,nope")
    argv = pytest_argv(["storm"])
    assert argv[-1] == f"{TESTS}::{SCENARIOS['storm']}" and "-s" in argv
    # Every scenario names a test that exists in the chaos test file.
    text = TESTS.read_text()
    assert all(f"def {name}(" in text for name in SCENARIOS.values())


def test_the_command_is_registered() -> None:
    args = cli._parser().parse_args(["bench", "chaos", "--outage", "20", "--scenarios", "temporal"])
    assert isinstance(args, argparse.Namespace) and args.outage == 20 and args.scenarios == "temporal"
    assert cli._parser().parse_args(["bench", "chaos"]).outage == 60
