"""The ``rebound`` command line: run the worker and node agents, look at monitored jobs, steer the Fleet.

The lab (``rebound lab ...``) and its benchmarks (``rebound bench recovery|healthy``) plug in from ``deploy``
through the ``rebound.cli`` entry points (``workers.cli_plugins``): the composition root never imports the lab.
Exit codes: ``workers.console``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from workers.cli_plugins import Commands, load_plugins, runner_of
from workers.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE, exit_code_for
from workers.settings import Settings
from workflows.domain.errors import ReboundError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rebound", description="Keep distributed training jobs making progress.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("worker", help="run the central Rebound worker (workflows + cluster activities)")
    sub.add_parser("node-agent", help="run this node's agent (NVML reads) on task queue rebound-node-<node>")
    sub.add_parser("settings", help="print the effective settings (secrets masked)")

    w = sub.add_parser("watch", help="start monitoring a Slurm job (no-op if it is already monitored)")
    w.add_argument("job_id", type=int)
    w.add_argument("--poll", type=float, default=2.0, help="scheduler poll interval in seconds")

    s = sub.add_parser("status", help="monitored jobs and their recovery state")
    s.add_argument("job_id", type=int, nargs="?")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    t = sub.add_parser("timeline", help="a monitored job's incidents: evidence, actions, latencies")
    t.add_argument("job_id", type=int)
    t.add_argument("--json", action="store_true", help="machine-readable output")

    g = sub.add_parser("gpus", help="read a node's GPUs through its node agent")
    g.add_argument("node")
    g.add_argument("--json", action="store_true", help="machine-readable output")

    from workers import bench
    from workers.audit_cli import add_audit_parser
    from workers.diagnose_cli import add_diagnose_parser

    b = sub.add_parser(
        "bench", help="benchmarks: recovery on the lab, detection on a log corpus, attribution on recorded failures"
    )
    commands = Commands(top=sub, bench=b.add_subparsers(dest="bench_command", required=True, metavar="BENCH_COMMAND"))
    bench.register(commands)
    add_diagnose_parser(sub)
    from workers.checkpoints_cli import add_checkpoints_parser

    add_checkpoints_parser(sub)
    add_audit_parser(sub)
    from workers.fleet_cli import add_fleet_parsers
    from workers.incidents_cli import add_incident_parsers

    add_fleet_parsers(sub)
    add_incident_parsers(sub)
    load_plugins(commands)  # rebound lab, rebound bench recovery|healthy
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rebound`` console script."""
    args = _parser().parse_args(argv)
    try:
        run = runner_of(args)
        if run is not None:  # a benchmark, or a plugin's command
            return run(args)
        if args.command == "diagnose":
            from workers.diagnose_cli import run_diagnose_command

            return run_diagnose_command(args)
        if args.command == "checkpoints":
            from workers.checkpoints_cli import run_checkpoints_command

            return run_checkpoints_command(args)
        settings = Settings()
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.command == "settings":
            print(settings.model_dump_json(indent=2))
            return EXIT_OK
        if args.command == "audit":
            from workers.audit_cli import run_audit_command

            return run_audit_command(settings, args)
        if args.command == "worker":
            from workers.worker import run_worker

            return _run_async(lambda: run_worker(settings))
        if args.command == "node-agent":
            from workers.node_agent import run_node_agent

            return _run_async(lambda: run_node_agent(settings))
        from workers import jobs_cli

        if args.command == "watch":
            return _run_async(lambda: jobs_cli.watch(settings, args.job_id, args.poll))
        if args.command == "gpus":
            from workers import nodes_cli

            return _run_async(lambda: nodes_cli.gpus(settings, args.node, as_json=args.json))
        if args.command == "timeline":
            return _run_async(lambda: jobs_cli.timeline(settings, args.job_id, as_json=args.json))
        if args.command == "status":
            return _run_async(lambda: jobs_cli.status(settings, args.job_id, as_json=args.json))
        from workers.fleet_cli import is_fleet_command, run_fleet_command
        from workers.incidents_cli import is_incident_command, run_incident_command

        if is_incident_command(args.command):
            return _run_async(lambda: run_incident_command(settings, args))

        if is_fleet_command(args.command):
            return _run_async(lambda: run_fleet_command(settings, args))
    except ReboundError as e:
        print(f"rebound: {e.message}", file=sys.stderr)
        return exit_code_for(e.kind)
    except KeyboardInterrupt:
        return EXIT_FAIL
    return EXIT_USAGE


def _run_async(make: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    rc = asyncio.run(make())
    return EXIT_OK if rc is None else rc


def console_main() -> None:
    """Console-script wrapper: exit without interpreter finalisation (temporalio sdk-python#300)."""
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    console_main()
