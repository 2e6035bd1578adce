"""``rebound bench attribution``: the scenario suite loads and is what its generator writes, the facts are built as
the live activity builds them, the scoring math, the command, and the whole suite against its target."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from workers import cli
from workers.bench.attribution import TARGET_ACCURACY, format_report, run_suite, score
from workers.bench.attribution_suite import (
    LoadedScenario,
    Scenario,
    SuiteError,
    build_facts,
    load_scenario,
    load_suite,
)
from workflows.domain.incident import ActionRung, Attribution, FailureClass

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "tests" / "data" / "attribution"

# Scenarios the current rules get wrong (the bench's report explains each). The gate test below is expected to fail
# until they are fixed; this set keeps every other scenario from regressing meanwhile.
KNOWN_GAPS = {
    "lab-requeue-no-failure": "only rank 0's log of a requeue was kept, so n2's ranks look silent: named at confidence "
    "0.4 (held for an operator, never drained); live, the watch sees the requeue and never attributes it",
}


@pytest.fixture(scope="module")
def suite() -> list[LoadedScenario]:
    return load_suite(SUITE)


@pytest.fixture(scope="module")
def report(suite: list[LoadedScenario]) -> dict[str, Any]:
    return score([s.scenario for s in suite], run_suite(suite))


# ----- the suite --------------------------------------------------------------------------------------------------


def test_every_scenario_loads_and_validates(suite: list[LoadedScenario]) -> None:
    ids = [s.scenario.id for s in suite]
    assert len(ids) == len(set(ids)) >= 24
    lab = [s for s in suite if s.scenario.source == "lab"]
    assert len(lab) >= 4
    big = [s for s in suite if len(s.scenario.job_nodes) == 4 and s.scenario.source == "constructed"]
    assert len(big) >= 20
    for loaded in suite:
        scn = loaded.scenario
        assert set(scn.truth.culprit_nodes) <= set(scn.job_nodes)
        assert scn.healthy_nodes == tuple(n for n in scn.job_nodes if n not in scn.truth.culprit_nodes)
        assert scn.truth.why, scn.id
        assert build_facts(loaded).findings or scn.id == "stragglers-only", scn.id


def test_the_suite_is_what_the_generator_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("attribution_generate", SUITE / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their string annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        written = module.write_suite(tmp_path)
    finally:
        del sys.modules[spec.name]
    assert sorted(written) == sorted(d.name for d in SUITE.iterdir() if (d / "scenario.json").is_file())
    for directory in tmp_path.iterdir():
        fresh = {p.name: p.read_bytes() for p in directory.iterdir()}
        kept = {p.name: p.read_bytes() for p in (SUITE / directory.name).iterdir()}
        assert fresh == kept, f"{directory.name}: edit generate.py and rerun it, not the files"


def test_lab_scenarios_are_verbatim_captures() -> None:
    logs = REPO / "tests" / "data" / "logs"
    assert (SUITE / "lab-demo-crash" / "job-7-rank-1.log").read_bytes() == (logs / "demo-crash-rank-1.log").read_bytes()
    assert (SUITE / "lab-requeue-no-failure" / "job-1-batch.log").read_bytes() == (
        logs / "lab-requeue-batch.log"
    ).read_bytes()


# ----- loading errors -----------------------------------------------------------------------------------------------


def _scenario(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "s",
        "title": "t",
        "source": "constructed",
        "job_id": 5,
        "job_nodes": ["n1", "n2"],
        "task_count": 4,
        "logs": ["job-%j-rank-%t.log", "job-%j-batch.log"],
        "truth": {"culprit_nodes": ["n2"], "failure_class": "unknown", "retryable": True, "why": "w"},
    }
    base.update(over)
    return base


def _write(root: Path, meta: dict[str, Any], files: dict[str, str]) -> Path:
    directory = root / str(meta.get("id", "s"))
    directory.mkdir(parents=True)
    (directory / "scenario.json").write_text(json.dumps(meta))
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


CRASH = {
    "job-5-rank-0.log": "2026-12-03T09:14:05.900Z [ERROR] rank=0/4 node=n1 step=7 all_reduce failed\n"
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.1.0.2]:47113\n",
    "job-5-rank-2.log": "2026-12-03T09:14:05.600Z [ERROR] rank=2/4 node=n2 step=7 fatal error: exiting with code 13\n",
    "job-5-batch.log": "srun: error: n1: task 0: Exited with exit code 1\n"
    "srun: error: n2: task 2: Exited with exit code 13\n",
}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (_scenario(job_nodes=["n1", "n1"]), "job_nodes repeat a node"),
        (_scenario(truth={"culprit_nodes": ["n9"], "failure_class": "unknown", "retryable": True}), "not job nodes"),
        (_scenario(nodes={"n9": {"state": "down"}}), "nodes ['n9'] are not job nodes"),
        (_scenario(logs=["/var/log/x.log"]), "must be relative"),
        (_scenario(logs=["../x.log"]), "must be relative"),
        (_scenario(task_count=1), "task_count 1 is below the 2 job nodes"),
        (_scenario(truth={"culprit_nodes": [], "failure_class": "cosmic", "retryable": True}), "truth.failure_class"),
        (_scenario(gpu_events=[{"kind": "xid", "host": "n1", "xdi": 79}]), "gpu_events.0.xdi"),
        (_scenario(id="other"), "id 'other' is not the directory's name 's'"),
        (_scenario(logs=["job-%j-rank-%t.log", "missing-%j.log"]), "log pattern 'missing-%j.log' matches no file"),
    ],
)
def test_a_bad_scenario_is_a_clear_error(tmp_path: Path, meta: dict[str, Any], message: str) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / "scenario.json").write_text(json.dumps(meta))
    for name, text in CRASH.items():
        (directory / name).write_text(text)
    with pytest.raises(SuiteError) as err:
        load_scenario(directory)
    assert message in str(err.value) and "scenario.json" in str(err.value)


def test_unreadable_or_empty_suites(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="not a directory"):
        load_suite(tmp_path / "nope")
    with pytest.raises(SuiteError, match="no scenario"):
        load_suite(tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "scenario.json").write_text("{not json")
    with pytest.raises(SuiteError, match="invalid scenario"):
        load_suite(tmp_path)


# ----- the facts ----------------------------------------------------------------------------------------------------


def test_facts_are_built_as_the_live_activity_builds_them(tmp_path: Path) -> None:
    loaded = load_scenario(_write(tmp_path, _scenario(nodes={"n1": {"flags": ["NOT_RESPONDING"]}}), CRASH))
    facts = build_facts(loaded)
    assert facts.rank_nodes == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}  # srun's block layout, whatever the job's
    assert facts.unresponsive_nodes == ["n1"]
    assert facts.ranks_logging == [0, 2]  # no window: every line read counts
    # Reading order: by path (the batch log first), then offset; findings numbered in that order.
    assert [(f.kind, f.rank, f.order) for f in facts.findings] == [
        ("rank_exit", 0, 0),
        ("rank_exit", 2, 1),
        ("comm_error", 0, 2),
        ("rank_exit", 2, 3),
    ]


def test_the_window_decides_which_ranks_went_silent(tmp_path: Path) -> None:
    files = {
        "job-5-rank-0.log": "2026-12-03T09:14:01.000Z [INFO] rank=0/4 node=n1 step=6 loss=1.0 step_time=0.4s\n"
        "2026-12-03T09:14:06.000Z [ERROR] rank=0/4 node=n1 step=7 all_reduce failed\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.1.0.2]:1\n",
        "job-5-rank-2.log": "2026-12-03T09:14:01.100Z [INFO] rank=2/4 node=n2 step=6 loss=1.0 step_time=0.4s\n",
        "job-5-batch.log": "srun: error: n1: task 0: Exited with exit code 1\n",
    }
    meta = _scenario(window_start="2026-12-03T09:14:05")  # naive: taken as UTC, like the logs' own times
    loaded = load_scenario(_write(tmp_path, meta, files))
    assert loaded.scenario.window_start == datetime(2026, 12, 3, 9, 14, 5, tzinfo=UTC)
    facts = build_facts(loaded)
    # Rank 2 wrote only before the window; rank 0 wrote after it; srun's line names no rank of its own.
    assert facts.ranks_logging == [0]
    a = run_suite([loaded])[0]
    assert a.cause == "ranks-vanished" and a.implicated_nodes == ("n2",) and a.confidence < 0.5


# ----- scoring ------------------------------------------------------------------------------------------------------


def _scn(id: str, culprits: Sequence[str], klass: str = "hardware", retryable: bool = True) -> Scenario:
    return Scenario.model_validate(
        _scenario(
            id=id,
            job_nodes=["n1", "n2", "n3", "n4"],
            task_count=16,
            truth={"culprit_nodes": list(culprits), "failure_class": klass, "retryable": retryable},
        )
    )


def _att(*nodes: str, klass: FailureClass = FailureClass.HARDWARE, retryable: bool = True) -> Attribution:
    return Attribution(
        failure_class=klass, cause="c", retryable=retryable, confidence=0.5, implicated_nodes=nodes, explanation="e"
    )


def test_scoring_math_on_tiny_cases() -> None:
    scenarios = [
        _scn("hit", ["n2"]),
        _scn("second-is-right", ["n2"]),
        _scn("either-of-two", ["n1", "n4"]),
        _scn("nothing-at-fault", [], "user", retryable=False),
        _scn("invented-culprit", [], "unknown"),
        _scn("no-answer", ["n3"]),
    ]
    attributions = [
        _att("n2"),
        _att("n1", "n2"),
        _att("n4"),
        _att(klass=FailureClass.USER, retryable=False),
        _att("n3", klass=FailureClass.UNKNOWN),
        _att(klass=FailureClass.UNKNOWN),
    ]
    r = score(scenarios, attributions)
    assert [row["top1_correct"] for row in r["results"]] == [True, False, True, True, False, False]
    assert (r["top1_correct"], r["top1_accuracy"], r["with_culprit"]) == (3, 0.5, 4)
    assert r["healthy_drains"] == [
        {"id": "second-is-right", "nodes": ["n1"]},
        {"id": "invented-culprit", "nodes": ["n3"]},
    ]
    assert r["healthy_drain_count"] == 2
    assert r["misses"] == ["second-is-right", "invented-culprit", "no-answer"]
    assert (r["failure_class_correct"], r["failure_class_accuracy"]) == (5, 0.8333)  # no-answer: unknown != hardware
    assert (r["retryable_correct"], r["retryable_accuracy"]) == (6, 1.0)
    assert r["passed"] is False
    text = format_report(r)
    assert "top-1 node accuracy: 3/6 = 0.5000" in text and "healthy-node drains: 2" in text
    assert "second-is-right: n1" in text and text.endswith("FAIL")


def test_the_gate_is_the_target_and_no_healthy_drain() -> None:
    hits = [(_scn(f"h{i}", ["n1"]), _att("n1")) for i in range(19)]

    def gate(last: tuple[Scenario, Attribution]) -> bool:
        scenarios, attributions = zip(*[*hits, last], strict=True)
        return bool(score(scenarios, attributions)["passed"])

    assert TARGET_ACCURACY == 0.95
    assert gate((_scn("miss", ["n1"]), _att())) is True  # 19/20 = 0.95, nothing drained
    assert gate((_scn("drain", ["n1"]), _att("n1", "n2"))) is False  # top-1 right, but n2 is healthy
    hits.pop()
    assert gate((_scn("miss", ["n1"]), _att())) is False  # 18/19... one fewer hit: 18/19 = 0.947


def test_the_rung_is_scored_and_a_drain_without_node_evidence_fails() -> None:
    crash = Scenario.model_validate(
        _scenario(
            id="crash",
            truth={"culprit_nodes": ["n2"], "failure_class": "unknown", "retryable": True, "action": "exclude"},
        )
    )
    excluded = _att("n2").model_copy(update={"action": ActionRung.EXCLUDE})
    drained = _att("n2").model_copy(update={"action": ActionRung.DRAIN})
    ok = score([crash], [excluded])
    assert ok["passed"] and ok["action_correct"] == 1 and ok["actions"]["exclude"] == 1
    bad = score([crash], [drained])
    assert not bad["passed"] and bad["unjustified_drains"] == ["crash"]
    assert "drains without node-level evidence: 1  crash" in format_report(bad)
    # An attribution made without the ladder asks for a drain (what the live recovery did before it).
    assert score([crash], [_att("n2")])["unjustified_drains"] == ["crash"]


def test_layout_mismaps_are_counted() -> None:
    cyclic = Scenario.model_validate(_scenario(job_nodes=["n1", "n2", "n3", "n4"], task_count=16, layout="cyclic"))
    row = score([cyclic], [_att("n2")])["results"][0]
    assert row["block_layout_mismapped_ranks"] == 12  # only ranks 0, 5, 10, 15 land where block puts them


# ----- the command ----------------------------------------------------------------------------------------------------


def test_bench_attribution_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite"
    _write(suite, _scenario(id="crash"), CRASH)
    out = tmp_path / "res" / "attribution.json"
    assert cli.main(["bench", "attribution", "--scenarios", str(suite), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "attribution benchmark: 1 scenarios" in printed and "top-1 node accuracy: 1/1 = 1.0000" in printed
    report = json.loads(out.read_text())
    assert report["passed"] is True and report["results"][0]["implicated_nodes"] == ["n2"]
    # The same logs with n1 as the truth: n2 is then a healthy node; a rank's exit is the job's word, so n2 is only
    # kept out of the job's next placement (top-1 misses, nothing is drained).
    wrong = tmp_path / "wrong"
    meta = _scenario(id="crash", truth={"culprit_nodes": ["n1"], "failure_class": "unknown", "retryable": True})
    _write(wrong, meta, CRASH)
    assert cli.main(["bench", "attribution", "--scenarios", str(wrong)]) == 1
    printed = capsys.readouterr().out
    assert "healthy-node drains: 0" in printed
    assert (
        "healthy nodes excluded from the job's next placement only (suspicions, not drained): 1  crash: n2" in printed
    )
    assert cli.main(["bench", "attribution", "--scenarios", str(tmp_path / "missing")]) == 2
    assert "not a directory of scenarios" in capsys.readouterr().err


# ----- the whole suite ----------------------------------------------------------------------------------------------


def test_no_scenario_outside_the_known_gaps_misses_or_drains_a_healthy_node(report: dict[str, Any]) -> None:
    missed = {r["id"] for r in report["results"] if not r["top1_correct"] or r["healthy_drains"]}
    assert missed <= set(KNOWN_GAPS), format_report(report)


def test_the_suite_meets_the_target_with_no_healthy_drain(report: dict[str, Any]) -> None:
    assert report["top1_accuracy"] >= TARGET_ACCURACY, format_report(report)
    assert report["healthy_drain_count"] == 0, format_report(report)
