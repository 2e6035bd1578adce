"""Commands that plug into the ``rebound`` CLI from outside the composition root: the lab and its benchmarks.

``workers`` never imports the lab (``deploy``): the lab sits above it, and registers its commands through the
``rebound.cli`` entry-point group of the installed package (``pyproject.toml``)::

    [project.entry-points."rebound.cli"]
    lab = "deploy.local.cli:register"

Each entry point names a ``register(commands: Commands) -> None`` that adds its parsers, each bound to the
function that runs it. A plugin's parsers are built when the CLI parses its arguments (keep their imports light);
what they run imports the heavy parts when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

__all__ = ["PLUGIN_GROUP", "Commands", "RunCommand", "load_plugins", "runner_of"]

#: The entry-point group the CLI reads its plugins from.
PLUGIN_GROUP = "rebound.cli"

#: Runs one parsed command; returns its exit code.
RunCommand = Callable[[argparse.Namespace], int]

_RUN = "run_command"


@dataclass(frozen=True)
class Commands:
    """Where a plugin adds its commands: ``rebound NAME ...`` and ``rebound bench NAME ...``."""

    top: Any
    """The ``rebound`` subparsers (``argparse``'s ``_SubParsersAction``)."""
    bench: Any
    """The ``rebound bench`` subparsers."""

    def command(self, name: str, run: RunCommand, **parser_args: Any) -> argparse.ArgumentParser:
        """Add ``rebound NAME``, run by ``run``; returns its parser for the arguments."""
        return _bound(self.top.add_parser(name, **parser_args), run)

    def benchmark(self, name: str, run: RunCommand, **parser_args: Any) -> argparse.ArgumentParser:
        """Add ``rebound bench NAME``, run by ``run``; returns its parser for the arguments."""
        return _bound(self.bench.add_parser(name, **parser_args), run)


def _bound(parser: argparse.ArgumentParser, run: RunCommand) -> argparse.ArgumentParser:
    parser.set_defaults(**{_RUN: run})
    return parser


def runner_of(args: argparse.Namespace) -> RunCommand | None:
    """The function bound to the parsed command by ``Commands``; None for the CLI's own commands."""
    run: RunCommand | None = getattr(args, _RUN, None)
    return run


def load_plugins(commands: Commands) -> None:
    """Let every installed ``rebound.cli`` plugin register its commands, in name order (a stable ``--help``)."""
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        register: Callable[[Commands], None] = ep.load()
        register(commands)
