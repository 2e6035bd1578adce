"""GPU counts in Slurm's GRES/TRES strings, as ``squeue --json``/``sinfo --json`` (and slurmrestd) print them.

Node ``gres``: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2``, ``gpu:4,shard:8``; ``""`` for a node
without GRES (22.05, tests/data/slurm/sinfo.json). Job ``tres_per_node``: ``gres:gpu:2`` (22.05; ``--gres=gpu:2``
and ``--gpus-per-node=2``), ``gres/gpu:2`` in later versions; ``--gres=gpu`` alone asks for one. A count that
cannot be read is None (unknown), never 0.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["gpu_count", "job_gpus_per_node", "names_gpus"]


def _entries(text: str) -> list[str]:
    """Comma-separated entries, commas inside parentheses (``(S:0,1)``) kept."""
    out: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [e.strip() for e in out if e.strip()]


def _gpu_parts(entry: str) -> list[str] | None:
    """``gpu:a100:4(S:0-1)`` -> ``["gpu", "a100", "4"]``; None when the entry is not a GPU one."""
    name = entry.removeprefix("gres:").removeprefix("gres/")
    parts = name.split("(", 1)[0].split(":")
    return parts if parts[0] == "gpu" else None


def names_gpus(text: str) -> bool:
    """True when any entry of the string is a GPU one."""
    return any(_gpu_parts(e) is not None for e in _entries(text))


def gpu_count(text: str) -> int | None:
    """The GPUs a GRES/TRES string names (0 when it names none), or None when a GPU entry has an unreadable count."""
    total = 0
    for entry in _entries(text):
        parts = _gpu_parts(entry)
        if parts is None:
            continue
        last = parts[-1]
        if len(parts) == 1 or (len(parts) == 2 and not last.isdigit()):
            total += 1  # ``gpu`` or ``gpu:a100``: one GPU
        elif last.isdigit():
            total += int(last)
        else:
            return None
    return total


def job_gpus_per_node(text: Callable[[str], str]) -> int | None:
    """A job's GPUs per node from its ``tres_per_node`` (``text`` reads a field of the job); 0 when no TRES
    field asks for GPUs; None when they are asked per job or per task (``--gpus``, ``--gpus-per-task``: the per-node
    share depends on the layout).

    Its CPUs per node are Slurm's ``minimum_cpus_per_node`` (tasks per node x CPUs per task, or ``--mincpus``),
    unknown (0) when CPUs follow the GPUs (``cpus_per_tres``, ``--cpus-per-gpu``), which that minimum leaves out.
    """
    per_node = text("tres_per_node")
    if names_gpus(per_node):
        return gpu_count(per_node)
    if names_gpus(text("tres_per_job")) or names_gpus(text("tres_per_task")):
        return None
    return 0
