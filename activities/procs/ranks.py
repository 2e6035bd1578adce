"""Choosing one process per rank among a job's processes on a node. Pure: no ``/proc`` access here.

Several processes of a job can name the same rank, because children inherit their parent's environment:

* srun's batch script (``bash``, ``SLURM_PROCID=0``) and ``srun`` itself sit on the first node beside rank 0;
* torchrun (a Python process with ``SLURM_PROCID`` of its node) starts workers with ``RANK`` set;
* a wrapper (``bash -c "python train.py; ..."``) keeps the wrapped rank's environment;
* a rank's own helpers (DataLoader workers, multiprocessing's resource tracker, torch.compile workers) do too.

Rules, in order:

1. Slurm's own clients (``srun``, ``salloc``, ``sbatch``, ``slurmstepd``) are never ranks.
2. When any process on the node has ``RANK``, the ranks are torchrun-style workers: processes whose rank comes
   only from ``SLURM_PROCID`` are launchers (torchrun, the batch script) and are dropped.
3. A rank's helper (a child with the parent's rank whose command line is the parent's own, i.e. a fork, or that
   names ``multiprocessing``/``compile_worker``) is dropped: the rank is its parent.
4. Within one rank: Python processes beat others (wrappers, shells), then a leaf beats its ancestors (a launcher
   that wraps the rank), then the newest Slurm step, then the lowest pid. Every process passed over this way
   gets a note, so a surprising choice can be explained from the result.
"""

from __future__ import annotations

from collections.abc import Iterable

from activities.procs.proc import JobProcess

__all__ = ["LAUNCHER_COMMS", "choose_ranks"]

LAUNCHER_COMMS = frozenset({"srun", "salloc", "sbatch", "slurmstepd"})
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
