"""The operator's policy file, the watch settings and the shared snapshot cache's wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.slurm.snapshots import SnapshotCache
from tests.fakes.scheduler import FakeScheduler
from workers.discovery import load_selectors
from workers.settings import Settings, WatchSettings
from workers.wiring import build_snapshot_cache
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.recovery import RecoverySpec
from workflows.policy.optin import JobSelector

POLICY = """
# GPU jobs of the LLM team: recovered with a shared checkpoint area.
[[select]]
partitions = ["gpu"]
users = ["alice", "bob"]
name_regex = "llm-.*"

[select.spec]
checkpoint_dir = "/ckpt/shared"
restart_budget = 3
logs = ["/runs/logs/job-%j-rank-*.log"]

# Everything else in the debug partition, with the defaults.
[[select]]
partitions = ["debug"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_policy_file_loads_in_order(tmp_path: Path) -> None:
    selectors = load_selectors(_write(tmp_path, POLICY))
    assert selectors == [
        JobSelector(
            partitions=("gpu",),
            users=("alice", "bob"),
            name_regex="llm-.*",
            spec=RecoverySpec(checkpoint_dir="/ckpt/shared", restart_budget=3, logs=("/runs/logs/job-%j-rank-*.log",)),
        ),
        JobSelector(partitions=("debug",)),
    ]


def test_empty_policy_file_selects_nothing(tmp_path: Path) -> None:
    assert load_selectors(_write(tmp_path, "# nothing selected yet\n")) == []


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[[select]\n", "not valid TOML"),
        ("[select]\npartitions = ['gpu']\n", "array of tables"),
        ("[[selector]]\npartitions = ['gpu']\n", "unknown top-level key(s) selector"),
        ("[[select]]\npartition = ['gpu']\n", "#1: partition: Extra inputs are not permitted"),
        ("[[select]]\n[[select]]\nname_regex = 'llm-('\n", "#2: name_regex"),
        ("[[select]]\n[select.spec]\nrestart_budget = 500\n", "#1: spec.restart_budget"),
        ("[[select]]\n[select.spec]\nbudget = 3\n", "#1: spec.budget"),
    ],
)
def test_policy_file_errors_are_clear(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ReboundError) as err:
        load_selectors(path)
    assert err.value.kind is FailureKind.CONFIGURATION
    assert str(path) in err.value.message
    assert words in err.value.message


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ReboundError, match="cannot read it"):
        load_selectors(tmp_path / "absent.toml")


def test_watch_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Settings().watch == WatchSettings(
        poll_interval_s=1.0, snapshot_max_age_s=1.0, policy_file=None, enabled=True
    )
    monkeypatch.setenv("REBOUND_WATCH__ENABLED", "false")
    monkeypatch.setenv("REBOUND_WATCH__POLICY_FILE", str(tmp_path / "p.toml"))
    monkeypatch.setenv("REBOUND_WATCH__POLL_INTERVAL_S", "2.5")
    watch = Settings().watch
    assert (watch.enabled, watch.policy_file, watch.poll_interval_s) == (False, tmp_path / "p.toml", 2.5)


def test_snapshot_cache_follows_the_settings() -> None:
    cache = build_snapshot_cache(FakeScheduler(), WatchSettings(snapshot_max_age_s=2.0))
    assert isinstance(cache, SnapshotCache)
    assert cache.max_age_s == 2.0
