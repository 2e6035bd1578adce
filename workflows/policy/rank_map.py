"""Rank -> node from facts (``workflows.domain.ranks.RankMap``). Pure: the node agents' answers and the log findings
in, the map out.

Rules, strongest first (a rank placed by a stronger rule is never moved by a weaker one; evidence, rule 4, beats
only a layout, rule 3: a line that names both is Slurm's or the job's own word, a layout is derived):

1. **Processes** (``RankSource.PROCESS``): a node agent saw the rank's process on its node. Its ``RANK`` is the
   global rank under torchrun/torch elastic, accelerate and the DeepSpeed launcher; its ``SLURM_PROCID`` under
   srun per rank and PyTorch Lightning's Slurm environment (there SLURM_PROCID *is* the global rank). Its
   ``SLURM_PROCID`` is also its Slurm task, placed the same way (torchrun's workers inherit their node's task).
   A rank two nodes both claim is placed nowhere.
2. **Launcher group** (``RankSource.LAUNCHER_GROUP``): a per-node launcher's worker with ``LOCAL_RANK`` l and
   ``LOCAL_WORLD_SIZE`` L at rank R says ranks ``R - l`` .. ``R - l + L - 1`` are on its node (torch elastic
   assigns a node's workers consecutive global ranks), so a rank that died before it was seen is still placed.
3. **Step layout** (``RankSource.STEP_LAYOUT``): only when the processes say the ranks are srun tasks (one task
   per rank) and srun gave the step's layout with a block (srun's default) or cyclic distribution. An
   ``arbitrary`` or ``plane`` distribution, or no layout, places only the ranks seen.
4. **Evidence** (``RankSource.EVIDENCE``): a finding that names a node and a rank (``%N`` in the file's name, a
   host prefix, a ``node=`` token) places the rank; one that names a node and a Slurm task (srun's ``n3: task 6:``,
   a labelled line) places the task, and the rank too only when the facts say tasks are ranks (srun per rank).

A map taken earlier (when the attempt started training) is merged under a newer one: ranks that died since then
keep their node. Anything else is unknown, and ``RankMap.unknown`` says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from workflows.domain.incident import LogFinding
from workflows.domain.procs import NodeProcessesResult
from workflows.domain.ranks import MAX_RANK_SPANS, Launcher, RankMap, RankSource, RankSpan, StepLayout

__all__ = ["build_rank_map", "layout_tasks", "merge_maps", "step_layout_map", "with_evidence"]

_MAX_NOTES = 20
#: A launcher group or a layout larger than this is not expanded (a corrupt LOCAL_WORLD_SIZE must not blow up).
_MAX_EXPANDED = 100_000

Placed = dict[int, tuple[str, RankSource]]


def layout_tasks(layout: StepLayout) -> dict[int, str] | None:
    """Task -> node for a step laid out ``block`` (srun's default) or ``cyclic``; None for any other distribution
    (``arbitrary``, ``plane``) or a layout too large to expand. Only the node-level part (before ``:``) counts."""
    kind = (layout.distribution.split(":", 1)[0] or "block").lower()
    total = sum(layout.tasks_per_node)
    if kind not in ("block", "cyclic") or total > _MAX_EXPANDED or len(layout.nodes) != len(layout.tasks_per_node):
        return None
    out: dict[int, str] = {}
    if kind == "block":
        for node, count in zip(layout.nodes, layout.tasks_per_node, strict=True):
            for _ in range(count):
                out[len(out)] = node
        return out
    left = list(layout.tasks_per_node)
    while len(out) < total:  # round robin over the nodes that still have room: srun's cyclic
        for i, node in enumerate(layout.nodes):
            if left[i] > 0:
                out[len(out)] = node
                left[i] -= 1
    return out


def build_rank_map(
    answers: Sequence[NodeProcessesResult | None],
    *,
    job_nodes: Sequence[str] = (),
    observed_at: datetime | None = None,
) -> RankMap:
    """The map the node agents' answers give (one answer per job node; None: the agent did not answer)."""
    ranks: Placed = {}
    tasks: Placed = {}
    conflicts: set[int] = set()
    notes: list[str] = []
    sources: set[str] = set()
    world: int | None = None
    layout: StepLayout | None = None
    silent = [n for n, a in zip(job_nodes, answers, strict=False) if a is None]
    for answer in answers:
        if answer is None:
            continue
        if answer.error:
            notes.append(f"{answer.node}: {answer.error}"[:200])
        layout = layout or answer.step_layout
        for p in answer.processes:
            node = p.node or answer.node
            sources.add(p.rank_source)
            world = world or p.world_size
            if p.rank in ranks and ranks[p.rank][0] != node:
                conflicts.add(p.rank)
                notes.append(f"rank {p.rank} claimed on {ranks[p.rank][0]} and {node}: placed nowhere")
            ranks.setdefault(p.rank, (node, RankSource.PROCESS))
            if p.task is not None:
                tasks.setdefault(p.task, (node, RankSource.PROCESS))
    for r in conflicts:
        ranks.pop(r, None)
    for answer in answers:  # after every process: a process seen beats a sibling's word
        if answer is None:
            continue
        for p in answer.processes:
            if p.rank_source == "RANK" and p.local_rank is not None and p.local_world_size and p.rank not in conflicts:
                base = p.rank - p.local_rank
                if base >= 0 and 0 < p.local_world_size <= _MAX_EXPANDED:
                    for r in range(base, base + p.local_world_size):
                        if r not in conflicts:
                            ranks.setdefault(r, (p.node or answer.node, RankSource.LAUNCHER_GROUP))
    launcher = Launcher.UNKNOWN
    if "RANK" in sources:
        launcher = Launcher.PER_NODE
    elif "SLURM_PROCID" in sources:
        launcher = Launcher.SRUN
    if launcher is Launcher.SRUN and layout is not None:
        laid = layout_tasks(layout)
        if laid is None:
            notes.append(f"step distribution {layout.distribution!r}: only the ranks seen are placed")
        else:
            world = world or len(laid)
            for t, node in laid.items():
                ranks.setdefault(t, (node, RankSource.STEP_LAYOUT))
                tasks.setdefault(t, (node, RankSource.STEP_LAYOUT))
    if not sources:
        why = "no node agent saw a process of the job" if answers else "no process view of the job"
    elif silent:
        why = f"not seen by the agents that answered; no answer from {', '.join(silent)}"
    else:
        why = "no process of that rank was seen, and no layout places it"
    return _to_map(launcher, ranks, tasks, world, why, notes, observed_at)


def step_layout_map(layout: StepLayout, *, tasks_are_ranks: bool) -> RankMap:
    """The map srun's layout alone gives: its tasks' nodes, and the ranks' too when the job runs one task per rank
    (rule 3); a per-node launcher's ranks stay unknown."""
    laid = layout_tasks(layout) or {}
    tasks: Placed = {t: (n, RankSource.STEP_LAYOUT) for t, n in laid.items()}
    notes = [] if laid else [f"step distribution {layout.distribution!r}: no task placed"]
    if tasks_are_ranks:
        why = "not in the step's layout"
        return _to_map(Launcher.SRUN, dict(tasks), tasks, len(laid) or None, why, notes, None)
    why = "the ranks are a per-node launcher's, and no process view places them"
    return _to_map(Launcher.PER_NODE, {}, tasks, None, why, notes, None)


def merge_maps(newer: RankMap, older: RankMap | None) -> RankMap:
    """``newer`` with ``older``'s entries for what ``newer`` does not place (ranks that died since ``older``)."""
    if older is None or older.is_empty:
        return newer
    if newer.is_empty and newer.launcher is Launcher.UNKNOWN:
        return older
    ranks = _placed(newer.ranks)
    for r, v in _placed(older.ranks).items():
        ranks.setdefault(r, v)
    tasks = _placed(newer.tasks)
    for t, v in _placed(older.tasks).items():
        tasks.setdefault(t, v)
    launcher = newer.launcher if newer.launcher is not Launcher.UNKNOWN else older.launcher
    notes = [*newer.notes, *older.notes]
    return _to_map(
        launcher,
        ranks,
        tasks,
        newer.world_size or older.world_size,
        newer.unknown,
        notes,
        newer.observed_at or older.observed_at,
    )


def with_evidence(base: RankMap | None, findings: Iterable[LogFinding], job_nodes: Sequence[str]) -> RankMap:
    """``base`` plus what the findings name (rule 4) for the ranks and tasks it does not place."""
    base = base or RankMap()
    nodes = set(job_nodes)
    ranks = _placed(base.ranks)
    tasks = _placed(base.tasks)
    added = False
    for f in findings:
        if not f.node or (nodes and f.node not in nodes):
            continue
        names_rank = f.rank is not None and (not f.rank_is_task or base.tasks_are_ranks)
        if f.rank is not None and names_rank and _weaker(ranks.get(f.rank)):
            ranks[f.rank] = (f.node, RankSource.EVIDENCE)
            added = True
        if f.task is not None and _weaker(tasks.get(f.task)):
            tasks[f.task] = (f.node, RankSource.EVIDENCE)
            added = True
    if not added:
        return base
    return _to_map(base.launcher, ranks, tasks, base.world_size, base.unknown, list(base.notes), base.observed_at)


def _weaker(entry: tuple[str, RankSource] | None) -> bool:
    """Whether evidence may place what ``entry`` holds: nothing yet, or a derived layout."""
    return entry is None or entry[1] is RankSource.STEP_LAYOUT


def _placed(spans: Iterable[RankSpan]) -> Placed:
    out: Placed = {}
    for s in spans:
        for n in range(s.first, min(s.last, s.first + _MAX_EXPANDED) + 1):
            out.setdefault(n, (s.node, s.source))
    return out


def _spans(placed: Mapping[int, tuple[str, RankSource]], notes: list[str], what: str) -> tuple[RankSpan, ...]:
    spans: list[RankSpan] = []
    for n in sorted(placed):
        node, source = placed[n]
        last = spans[-1] if spans else None
        if last is not None and last.last == n - 1 and last.node == node and last.source is source:
            spans[-1] = last.model_copy(update={"last": n})
            continue
        if len(spans) >= MAX_RANK_SPANS:
            notes.append(f"{what} from {n} on not kept: more than {MAX_RANK_SPANS} spans")
            break
        spans.append(RankSpan(first=n, last=n, node=node, source=source))
    return tuple(spans)


def _to_map(
    launcher: Launcher,
    ranks: Placed,
    tasks: Placed,
    world: int | None,
    why: str,
    notes: list[str],
    observed_at: datetime | None,
) -> RankMap:
    rank_spans = _spans(ranks, notes, "ranks")
    task_spans = _spans(tasks, notes, "tasks")
    return RankMap(
        launcher=launcher,
        ranks=rank_spans,
        tasks=task_spans,
        world_size=world,
        unknown=why,
        notes=tuple(dict.fromkeys(notes))[:_MAX_NOTES],
        observed_at=observed_at,
    )
