"""The node check's program: one instance per rank of the check job, all on the node under check (ADR 018).

Every rank joins a gloo all-reduce with the node's other ranks (torch.distributed on CPU, rendezvous through a
file on the node: no port to pick) and checks the sum; rank 0 also runs the tools the node has, each bounded:
``dcgmi diag -r 1``, nccl-tests' ``all_reduce_perf`` over the node's GPUs, ``ibstat``. A tool that is not there
is skipped (nothing tested), never a failure. Each rank prints one ``RankReport`` line
(``workflows.domain.node_check.RANK_REPORT_PREFIX``) and exits 1 when a probe failed. The NVML/DCGM read of the
node's GPUs is the node agent's, made by the Fleet beside this job.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from activities.node_check.tools import parse_dcgmi_diag, parse_ibstat, parse_nccl_all_reduce
from workflows.domain.node_check import RANK_REPORT_PREFIX, ProbeResult, RankReport

__all__ = ["gloo_all_reduce", "main", "run_tool"]

_ELEMENTS = 1 << 16


def gloo_all_reduce(rank: int, world: int, store: Path, timeout_s: float) -> ProbeResult:
    """Sum a tensor across the node's ranks and check every element; any error or a timeout fails it."""
    started = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this node
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
        try:
            tensor = torch.full((_ELEMENTS,), float(rank + 1))
            dist.all_reduce(tensor)
            expected = world * (world + 1) / 2
            wrong = int((tensor != expected).sum().item())
        finally:
            dist.destroy_process_group()
    except Exception as e:  # every failure of the collective is the finding (timeout, peer gone, bad store)
        text = " ".join(str(e).split())[:300] or type(e).__name__
        return ProbeResult(name="gloo-all-reduce", ok=False, detail=f"{type(e).__name__}: {text}")
    took = time.monotonic() - started
    if wrong:
        return ProbeResult(name="gloo-all-reduce", ok=False, detail=f"{wrong} of {_ELEMENTS} elements wrong")
    return ProbeResult(name="gloo-all-reduce", ok=True, detail=f"{world} ranks, {took:.2f} s")


def run_tool(name: str, argv: Sequence[str], parse: Callable[[str], ProbeResult], timeout_s: float) -> ProbeResult:
    """Run one tool if the node has it (argument list, bounded) and parse what it printed."""
    if shutil.which(argv[0]) is None:
        return ProbeResult(name=name, ok=True, skipped=True, detail=f"{argv[0]} not installed")
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ProbeResult(name=name, ok=False, detail=f"{argv[0]} ran past {timeout_s:g} s")
    except OSError as e:
        return ProbeResult(name=name, ok=False, detail=f"{argv[0]} could not run: {e}")
    return parse(done.stdout + done.stderr)


def _tools(timeout_s: float, gpus: int) -> list[ProbeResult]:
    return [
        run_tool("dcgmi-diag", ("dcgmi", "diag", "-r", "1"), parse_dcgmi_diag, timeout_s),
        run_tool(
            "nccl-all-reduce",
            ("all_reduce_perf", "-b", "8", "-e", "128M", "-f", "2", "-g", str(max(gpus, 1))),
            parse_nccl_all_reduce,
            timeout_s,
        ),
        run_tool("ib-ports", ("ibstat",), parse_ibstat, timeout_s),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One rank of Rebound's node check (run by the check job).")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="bound of the all-reduce and of each tool")
    parser.add_argument("--no-tools", action="store_true", help="the all-reduce only")
    args = parser.parse_args(argv)
    env = os.environ
    rank, world = int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_NTASKS", "1"))
    node = env.get("SLURMD_NODENAME", "")
    job = env.get("SLURM_JOB_ID", str(os.getppid()))
    # Job ids repeat across clusters sharing a host (two labs): the cluster's name keeps stores apart.
    store = Path(tempfile.gettempdir()) / f"rebound-node-check-{env.get('SLURM_CLUSTER_NAME', 'x')}-{job}.store"
    probes = [gloo_all_reduce(rank, world, store, args.timeout_s)]
    if rank == 0 and not args.no_tools:
        gpus = len([g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g])
        probes += _tools(args.timeout_s, gpus)
    report = RankReport(node=node, rank=rank, world=world, probes=tuple(probes))
    print(RANK_REPORT_PREFIX + report.model_dump_json(), flush=True)
    if rank == 0:
        store.unlink(missing_ok=True)
    return 0 if all(p.ok for p in probes) else 1


if __name__ == "__main__":
    sys.exit(main())
