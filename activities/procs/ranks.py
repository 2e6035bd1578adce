"""Choosing one process per rank among a job's processes on a node. Pure: no ``/proc`` access here.

Several processes of a job can name the same rank, because children inherit their parent's environment:

* srun's batch script (``bash``, ``SLURM_PROCID=0``) and ``srun`` itself sit on the first node beside rank 0;
* torchrun (a Python process with ``SLURM_PROCID`` of its node) starts workers with ``RANK`` set;
* a wrapper (``bash -c "python train.py; ..."``) keeps the wrapped rank's environment;
* a rank's own helpers (DataLoader workers, multiprocessing's resource tracker, torch.compile workers) do too.

Rules, in order:

1. Slurm's own clients (``srun``, ``salloc``, ``sbatch``, ``slurmstepd``) are never ranks.
2. When any process on the node has ``RANK``, the ranks are torchrun-style workers: processes whose rank comes
   only from ``SLURM_PROCID`` are launchers (torchrun, the batch script) and are dropped. A per-node launcher
   (torchrun, ``torch.distributed.run``/``launch``, ``accelerate launch``, DeepSpeed's launcher) is never a rank,
   even before its workers start: asked then (torchrun still in its rendezvous), the node shows no rank yet and
   the rank map looks again, rather than taking the launchers for srun-style ranks (seen on the lab).
3. A rank's helper (a child with the parent's rank whose command line is the parent's own, i.e. a fork, or that
   names ``multiprocessing``/``compile_worker``) is dropped: the rank is its parent.
4. Within one rank: Python processes beat others (wrappers, shells), then a leaf beats its ancestors (a launcher
   that wraps the rank), then the newest Slurm step, then the lowest pid. Every process passed over this way
   gets a note, so a surprising choice can be explained from the result.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from activities.procs.proc import JobProcess
from activities.slurm.hostlist import HostlistError, expand
from workflows.domain.ranks import StepLayout

__all__ = ["LAUNCHER_COMMS", "choose_ranks", "parse_tasks_per_node", "runs_node_launcher", "step_layout"]

_TASKS_PER_NODE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_MAX_LAYOUT_NODES = 100_000

LAUNCHER_COMMS = frozenset({"srun", "salloc", "sbatch", "slurmstepd"})
#: Per-node launchers, by a program name or module among their first arguments: their workers carry ``RANK``.
_NODE_LAUNCHERS = frozenset(
    {
        "torchrun",
        "torch.distributed.run",
        "torch.distributed.launch",
        "deepspeed.launcher.launch",
        "accelerate.commands.launch",
    }
)
_ACCELERATE = frozenset({"accelerate", "accelerate.commands.accelerate_cli"})


def runs_node_launcher(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a per-node launcher (``torchrun ...``, ``python -m torch.distributed.run ...``,
    ``accelerate launch ...``, ``python -m deepspeed.launcher.launch ...``): judged by the program it runs (an
    interpreter's script or ``-m`` module), never by words later on the line."""
    program, at = _program(argv)
    if program in _NODE_LAUNCHERS:
        return True
    return program in _ACCELERATE and at + 1 < len(argv) and argv[at + 1] == "launch"


def _program(argv: Sequence[str]) -> tuple[str, int]:
    """The program ``argv`` runs and its index: argv[0], or for a Python interpreter its script or ``-m`` module."""
    if not argv:
        return "", 0
    if not os.path.basename(argv[0]).startswith("python"):
        return os.path.basename(argv[0]), 0
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "-m":
            return (argv[i + 1], i + 1) if i + 1 < len(argv) else ("", i)
        i += 1
    return (os.path.basename(argv[i]), i) if i < len(argv) else ("", i)


_HELPER_MARKERS = ("multiprocessing", "compile_worker", "torch._inductor")


def _is_helper(proc: JobProcess, parent: JobProcess | None) -> bool:
    if parent is None or parent.rank != proc.rank:
        return False
    joined = " ".join(proc.argv)
    return proc.argv == parent.argv or any(marker in joined for marker in _HELPER_MARKERS)


def _ancestors(proc: JobProcess, by_pid: dict[int, JobProcess]) -> Iterable[int]:
    seen: set[int] = set()
    ppid = proc.stat.ppid
    while ppid in by_pid and ppid not in seen:  # the seen-set guards against a cycle in a fake or racy tree
        seen.add(ppid)
        yield ppid
        ppid = by_pid[ppid].stat.ppid


def _step_key(proc: JobProcess) -> int:
    return int(proc.step_id) if proc.step_id.isdigit() else -1


def choose_ranks(processes: Iterable[JobProcess]) -> tuple[list[JobProcess], list[str]]:
    """One process per rank, sorted by rank, plus a note for every process passed over and why."""
    notes: list[str] = []
    procs = [p for p in processes if p.stat.comm not in LAUNCHER_COMMS]
    launchers = [p for p in procs if p.rank_source != "RANK" and runs_node_launcher(p.argv)]
    notes += [f"pid {p.pid} ({p.stat.comm}): per-node launcher (SLURM_PROCID={p.rank}), not a rank" for p in launchers]
    procs = [p for p in procs if p.pid not in {q.pid for q in launchers}]
    if any(p.rank_source == "RANK" for p in procs):
        for p in procs:
            if p.rank_source != "RANK":
                notes.append(f"pid {p.pid} ({p.stat.comm}): launcher of RANK workers (SLURM_PROCID={p.rank})")
        procs = [p for p in procs if p.rank_source == "RANK"]
    by_pid = {p.pid: p for p in procs}
    kept: list[JobProcess] = []
    for p in procs:
        if _is_helper(p, by_pid.get(p.stat.ppid)):
            notes.append(f"pid {p.pid} ({p.stat.comm}): helper of rank {p.rank}'s pid {p.stat.ppid}")
        else:
            kept.append(p)

    groups: dict[int, list[JobProcess]] = {}
    for p in kept:
        groups.setdefault(p.rank, []).append(p)
    chosen: list[JobProcess] = []
    for rank in sorted(groups):
        group = groups[rank]
        if len(group) == 1:
            chosen.append(group[0])
            continue
        pythons = [p for p in group if p.is_python] or group
        pids = {p.pid for p in pythons}
        has_descendant = {a for p in pythons for a in _ancestors(p, by_pid) if a in pids}
        leaves = [p for p in pythons if p.pid not in has_descendant] or pythons
        best = min(leaves, key=lambda p: (-_step_key(p), p.pid))
        chosen.append(best)
        for p in group:
            if p is not best:
                notes.append(f"pid {p.pid} ({p.stat.comm}): also claims rank {rank}; chose pid {best.pid}")
    return chosen, notes


def parse_tasks_per_node(text: str) -> tuple[int, ...]:
    """``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``) -> ``(2, 2, 2, 1)``.

    Raises:
        ValueError: Not Slurm's format, or more than 100 000 nodes.
    """
    counts: list[int] = []
    for part in text.split(","):
        m = _TASKS_PER_NODE.match(part.strip())
        if m is None:
            raise ValueError(f"tasks per node {text[:80]!r}: {part[:20]!r} is not N or N(xM)")
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > _MAX_LAYOUT_NODES:
            raise ValueError(f"tasks per node {text[:80]!r} names more than {_MAX_LAYOUT_NODES} nodes")
        counts += [int(m.group(1))] * repeat
    return tuple(counts)


def step_layout(chosen: Sequence[JobProcess]) -> tuple[StepLayout | None, str]:
    """The layout srun gave the ranks' step, when the ranks are srun tasks (not a launcher's workers); and a note
    when the environment's layout could not be read. The newest step's first rank speaks for the step."""
    tasks = [p for p in chosen if p.rank_source == "SLURM_PROCID" and p.layout[0] and p.layout[1]]
    if not tasks:
        return None, ""
    proc = max(tasks, key=lambda p: (_step_key(p), -p.pid))
    nodelist, per_node, distribution = proc.layout
    try:
        nodes = expand(nodelist)
        counts = parse_tasks_per_node(per_node)
    except (HostlistError, ValueError) as e:
        return None, f"pid {proc.pid}: step layout unreadable ({e})"
    if len(nodes) != len(counts):
        return None, f"pid {proc.pid}: {len(nodes)} step nodes but {len(counts)} task counts; layout ignored"
    return StepLayout(nodes=nodes, tasks_per_node=counts, distribution=distribution.strip()), ""
