"""``rebound bench slurm-scale``'s command line, summary and table (the run itself: ``deploy.bench.slurm_scale``).

The summary is pure: it turns the raw result (every sample, every fault) into the figures the table and the JSON
lead with: per read the median and max wall time, CPU, bytes and parse time; per fault kind and watch state how
many jobs were detected and the detection latency p50/max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["format_table", "run_slurm_scale_command", "summarize"]


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a raw result."""
    reads: dict[str, dict[str, Any]] = {}
    for cmd in sorted({r["command"] for r in result.get("reads", [])}):
        rows = [r for r in result["reads"] if r["command"] == cmd]
        reads[cmd] = {
            "samples": len(rows),
            "items": rows[-1]["items"],
            "wall_s": {"p50": statistics.median(r["wall_s"] for r in rows), "max": max(r["wall_s"] for r in rows)},
            "cpu_s": {"p50": statistics.median(r["cpu_s"] for r in rows), "max": max(r["cpu_s"] for r in rows)},
            "bytes": statistics.median(r["bytes"] for r in rows),
            "parse_s": {"p50": statistics.median(r["parse_s"] for r in rows), "max": max(r["parse_s"] for r in rows)},
        }
    faults: dict[str, dict[str, Any]] = {}
    for f in result.get("faults", []):
        key = f"{f['fault']} {'watched' if f['watched'] else 'unwatched'}"
        faults.setdefault(key, {"jobs": 0, "detected": 0, "acted": 0, "_lat": [], "_seen": [], "_act": []})
        entry = faults[key]
        entry["jobs"] += 1
        if f["detected_s"] is not None:
            entry["detected"] += 1
            entry["_lat"].append(f["detected_s"])
        if f.get("seen_s") is not None:
            entry["_seen"].append(f["seen_s"])
        if f["action_s"] is not None:
            entry["acted"] += 1
            entry["_act"].append(f["action_s"])
    for entry in faults.values():
        lat, seen, act = entry.pop("_lat"), entry.pop("_seen"), entry.pop("_act")
        entry["detection_s"] = {"p50": _pct(lat, 0.5), "max": max(lat, default=None)}
        entry["seen_s"] = {"p50": _pct(seen, 0.5), "max": max(seen, default=None)}
        entry["action_s"] = {"p50": _pct(act, 0.5), "max": max(act, default=None)}
    return {"reads": reads, "faults": faults}


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(result: dict[str, Any]) -> str:
    """The run as text: the set-up, the watch census, CPU, the reads, then detection per fault kind."""
    summary = result["summary"]
    census = result["census"]
    cpu = result["cpu_cores"]
    lines = [
        f"real Slurm at size: {result['nodes']} slurmd x {result['cpus_per_node']} CPUs, {result['jobs']} jobs; "
        f"lab up {result.get('lab_up_s', 0):.0f} s, submitted in {result['submit_s']:.0f} s, "
        f"{result.get('running', '?')} running at {result['all_running_s']:.0f} s, "
        f"{result.get('monitored', '?')} JobRecovery workflows at {result['all_monitored_s']:.0f} s",
        f"load average before {result['load_before'][0]:.2f}, steady {result['load_steady'][0]:.2f}; memory the "
        f"lab took {result['mem_used_by_lab_mb']:.0f} MB",
        f"watches: {census['watching']} running, {census['watch_waiting']} scheduled never started, "
        f"{census['anchor_waiting']} waiting to anchor, {census['other']} other (of {census['workflows']})",
        "CPU cores over {:.0f} s: ".format(cpu.get("window_s") or 0)
        + ", ".join(f"{k} {_s(v)}" for k, v in cpu.items() if k != "window_s")
        + "; RSS MB: "
        + ", ".join(f"{k} {_s(v, 0)}" for k, v in result["rss_mb"].items()),
        "",
        f"{'read':<14} {'items':>6} {'wall p50/max s':>15} {'cpu p50 s':>10} {'MB':>7} {'parse p50/max s':>16}",
    ]
    for cmd, r in summary["reads"].items():
        wall, parse = r["wall_s"], r["parse_s"]
        lines.append(
            f"{cmd:<14} {r['items']:>6} {_s(wall['p50']) + '/' + _s(wall['max']):>15} {_s(r['cpu_s']['p50']):>10} "
            f"{r['bytes'] / 1e6:>7.2f} {_s(parse['p50']) + '/' + _s(parse['max']):>16}"
        )
    lines += [
        "",
        f"{'fault':<18} {'jobs':>5} {'detected':>9} {'p50 s':>7} {'max s':>7} {'seen p50/max s':>15} {'acted':>6} "
        f"{'act p50 s':>10}",
    ]
    for key, f in summary["faults"].items():
        det, seen, act = f["detection_s"], f["seen_s"], f["action_s"]
        lines.append(
            f"{key:<18} {f['jobs']:>5} {f['detected']:>9} {_s(det['p50']):>7} {_s(det['max']):>7} "
            f"{_s(seen['p50'], 1) + '/' + _s(seen['max'], 1):>15} {f['acted']:>6} {_s(act['p50'], 1):>10}"
        )
    false = result.get("false_incidents", {})
    lines.append(
        f"incidents on jobs that were not faulted: {sum(len(v) for k, v in false.items() if k != '-1')} "
        f"on {sum(1 for k in false if k != '-1')} jobs" + (f" ({false['-1'][0]} workflows)" if "-1" in false else "")
    )
    after = result.get("census_after")
    if after:
        lines.append(f"watches after the faults: {after['watching']} running, {after['watch_waiting']} waiting")
    return "\n".join(lines)


def run_slurm_scale_command(args: argparse.Namespace) -> int:
    """Run the benchmark on its own lab; print the table; write the JSON. Exit 0 when it ran (whatever it found)."""
    from deploy.bench.context import BenchError
    from deploy.bench.slurm_scale import ScaleOptions, run_on_fresh_lab, take_down
    from deploy.local.processes import LabError

    opts = ScaleOptions(
        nodes=args.nodes,
        jobs=args.jobs,
        samples=args.samples,
        kills=args.kills,
        xid_nodes=args.xid_nodes,
        window_s=args.window,
        settle_s=args.settle,
        detect_timeout_s=args.timeout,
        keep_state=args.keep_state,
    )
    if args.down:
        take_down(opts)
        return 0
    try:
        result = asyncio.run(run_on_fresh_lab(opts))
    except (BenchError, LabError, RuntimeError) as e:
        print(f"rebound bench slurm-scale: {e}", file=sys.stderr)
        return 1
    result["summary"] = summarize(result)
    print(format_table(result))
    if args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0
