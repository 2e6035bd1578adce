"""``python -m deploy.local up|down|status|...``: the lab without the rebound CLI (same parsers, same code)."""

import argparse
import sys

from deploy.local.cli import register
from workers.cli_plugins import Commands, runner_of

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m deploy.local")
    top = parser.add_subparsers(dest="command", required=True)
    register(Commands(top=top, bench=None))  # the lab only: no benchmarks
    args = parser.parse_args(["lab", *sys.argv[1:]])
    run = runner_of(args)
    assert run is not None
    raise SystemExit(run(args))
