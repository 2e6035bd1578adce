"""The lab and its benchmarks plug into the ``rebound`` CLI through entry points; ``workers`` never imports the lab."""

from __future__ import annotations

import argparse
import ast
import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest

from workers import cli_plugins
from workers.cli_plugins import PLUGIN_GROUP, Commands, load_plugins, runner_of

REPO = Path(__file__).resolve().parents[3]


def _commands() -> tuple[argparse.ArgumentParser, Commands]:
    parser = argparse.ArgumentParser(prog="rebound")
    top = parser.add_subparsers(dest="command", required=True)
    bench = top.add_parser("bench").add_subparsers(dest="bench_command", required=True)
    return parser, Commands(top=top, bench=bench)


def _declared_plugins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    plugins: dict[str, str] = project["entry-points"][PLUGIN_GROUP]
    return plugins


class _EntryPoint:
    def __init__(self, name: str, target: str) -> None:
        self.name, self._target = name, target

    def load(self) -> Any:
        module, _, attr = self._target.partition(":")
        return getattr(importlib.import_module(module), attr)


def test_the_declared_plugins_add_the_lab_and_its_benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = _declared_plugins()
    assert set(declared) == {"lab", "bench-lab"}
    monkeypatch.setattr(
        cli_plugins,
        "entry_points",
        lambda group: [_EntryPoint(n, t) for n, t in declared.items() if group == PLUGIN_GROUP],
    )
    parser, commands = _commands()
    load_plugins(commands)

    from deploy.local.cli import run_lab_command

    assert runner_of(parser.parse_args(["lab", "up"])) is run_lab_command
    rec = parser.parse_args(["bench", "recovery", "--repeat", "2"])
    assert runner_of(rec) is not None and rec.repeat == 2
    assert runner_of(parser.parse_args(["bench", "healthy", "--minutes", "1"])) is not None


def test_the_cli_runs_its_own_benchmarks_without_the_lab() -> None:
    from workers import bench

    parser, commands = _commands()
    bench.register(commands)
    assert runner_of(parser.parse_args(["bench", "detection"])) is not None
    assert runner_of(parser.parse_args(["bench", "attribution"])) is not None
    assert runner_of(argparse.Namespace(command="status")) is None


def test_workers_never_import_deploy() -> None:
    offenders = []
    for path in sorted((REPO / "workers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n == "deploy" or n.startswith("deploy.")]
    assert offenders == []
