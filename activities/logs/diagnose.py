"""Root cause of a failed job from its logs: every line through the live detector's reader, then one verdict. Pure.

``Diagnoser`` is fed lines, one file (or stdin) at a time. Each line goes through ``crash.LineReader``, the reader
the live watch and the attribution activity use (the signature library, with its multi-line context: a traceback's
source lines are code, a destructor's ``Exception ignored in:`` traceback is not the job's error). The findings go
two ways:

* as the live path's findings, to ``workflows.policy.attribution``: ``attribute`` is what a live recovery concludes
  from these logs alone (``Diagnosis.attribution``), and ``deciding_findings`` is the evidence that conclusion rests
  on (a node failure, the first CUDA error, the code's exceptions, the first rank that died on its own);
* into a bounded summary: one ``Finding`` per category, at most ``MAX_EVIDENCE`` evidence lines each.

``result()`` names the root cause: the strongest category (by the order below) among the findings the
attribution rests on. When no finding decides (victims' reports alone, context), or the deciding ones are only
launchers' summaries (a task's exit says that a process ended, not why), the order below picks among them all:

1. hardware evidence beats the CUDA or communication errors it causes: first the kernel's word on a GPU (an
   XID, a GPU off the bus), then uncorrectable ECC, an InfiniBand error or a node failure;
2. a rank's own error (CUDA, out of memory, a signal, an exception, NaN loss, a checkpoint write) or the
   scheduler's verdict (time limit, preemption) beats a communication error: a NCCL timeout on 63 ranks is the
   victim of the one rank that failed;
3. communication errors beat launchers' summaries (torchrun's ``ChildFailedError``, then srun's task exits),
   which count only when nothing more specific is there;
4. among equals, a specific row beats a catch-all one (``weak``), a culprit a victim, and then the earliest line
   (files in the order given) wins;
5. srun's "Terminated" alone is never a root cause (the job was cancelled or requeued, not failed); nothing found,
   or only context (a requeue, an informational XID): category ``none``.

torchrun's summary blocks (``Root Cause (first observed failure)``, a failure's ``[n]:`` entry, or their tail when
the header was cut off) give their ``rank``, ``host`` and ``exitcode`` lines to the block's findings, and of
several blocks the earliest ``time`` is the first failure.

What the root cause's own line does not say (rank, host, GPU, exit code, signal) is taken from the same failure's
other lines, then from the launchers' summaries of one process, then from its file (see ``_fill_finding``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from activities.logs.crash import LineRead, LineReader, crash_findings, to_findings
from activities.logs.diagnosis import Diagnosis, EvidenceLine, Finding, normalize_gpu
from activities.logs.line import LogLine, rank_token, split_prefix
from activities.logs.log_context import FileContext, SummaryBlock, block_fields
from activities.logs.signature_types import CATEGORIES, Category, Prepared, Role, SignatureMatch
from activities.logs.streams import file_rank, split_text
from workflows.domain.findings import FindingKind
from workflows.domain.incident import Attribution, LogFinding
from workflows.policy.attribution import AttributionFacts, attribute, deciding_findings

__all__ = ["MAX_EVIDENCE", "Diagnoser", "diagnose_text"]

MAX_EVIDENCE = 5
"""Evidence lines kept per finding: the first ones, where a failure shows first."""
MAX_TEXT = 300
"""Characters of an evidence line kept."""
_MAX_RANKS = 4096
_MAX_HOSTS = 256
_MAX_KEYS = 4096
_MAX_FINDINGS = 20_000
"""Line findings kept for the attribution (the first ones): a log of a million NCCL warnings stays bounded."""

_SUMMARY_TIER = 2
"""Tiers up to this one are launchers' summaries (torchrun's ``ChildFailedError``, srun's task exits)."""
# Confidence by tier (signatures.CategoryInfo.tier): hardware evidence, a rank's own error, communication, summaries.
_BASE_CONFIDENCE = {6: 0.9, 5: 0.9, 4: 0.85, 3: 0.55, 2: 0.45, 1: 0.35, 0: 0.2}


_FIELDS = ("rank", "host", "gpu", "exit_code", "signal")
"""What a finding may take from the lines around it when its own line does not say (see ``_fill_finding``)."""


@dataclass
class _Best:
    """The line that represents a category: the most specific, then a culprit's, then the first."""

    key: tuple[int, int]
    """(specific row, role rank)."""
    hit: SignatureMatch
    fields: dict[str, object]
    path: str
    line: int
    in_block: bool
    """The line is part of a torchrun summary block: its rank, host and exit code are the block's."""


class _Acc:
    """One category's running summary (mutable; ``Diagnoser`` owns it)."""

    def __init__(self, category: Category, seq: int) -> None:
        self.category = category
        self.first_seq = seq
        self.best: _Best | None = None
        self.strong = False
        self.roles: set[Role] = set()
        self.lines = 0
        self.ranks: set[int] = set()
        self.hosts: set[str] = set()
        self.seen: dict[str, set[object]] = {name: set() for name in _FIELDS}
        """Values each field took across the category's lines (two at most: enough to tell whether they agree)."""
        self.block: tuple[str, dict[str, object]] | None = None
        """The earliest torchrun root-cause block (by its ``time``) that this category appeared in."""
        self.evidence: list[EvidenceLine] = []


class Diagnoser:
    """Streams lines in, keeps a bounded summary, and gives the ``Diagnosis`` (module docstring)."""

    def __init__(self, *, max_evidence: int = MAX_EVIDENCE) -> None:
        self._max_evidence = max(1, max_evidence)
        self._acc: dict[Category, _Acc] = {}
        self._reader = LineReader()
        self._findings: list[LogFinding] = []
        """The live path's findings, in reading order (``LogFinding.order`` indexes ``_categories`` too)."""
        self._categories: list[Category] = []
        self._ranks: set[int] = set()
        """Every rank that wrote a line: none went silent, as far as logs read after the fact can tell."""
        self._files: dict[str, FileContext] = {}
        self._blocks: dict[str, SummaryBlock] = {}
        self._seq = 0
        self._lines = 0
        self._sources: list[str] = []

    def feed(self, path: str, lines: Iterable[str]) -> None:
        """Read every line of one source (a file, stdin), numbered from 1."""
        self._sources.append(path)
        rank_of_file = file_rank(path)
        if len(self._files) >= _MAX_KEYS:
            self._files.clear()  # bounded memory: a pathological number of sources loses only file identities
        self._files.setdefault(path, FileContext(rank_of_file))
        for number, text in enumerate(lines, start=1):
            self._line(path, number, text, rank_of_file)

    def result(self) -> Diagnosis:
        """The diagnosis of everything fed so far."""
        for path in list(self._blocks):
            self._close_block(path)
        ranked = sorted((a for a in self._acc.values() if a.best is not None), key=_strength, reverse=True)
        attribution, deciding = self._attribute()
        # The strongest category among the findings the live attribution rests on; a launcher's summary there says
        # that a process ended, not why, so then (and when no finding decides) the category order alone names it.
        top = next((acc for acc in ranked if acc.category in deciding and _can_be_primary(acc)), None)
        if top is None or CATEGORIES[top.category].tier <= _SUMMARY_TIER:
            top = next((acc for acc in ranked if _can_be_primary(acc)), None)
        findings = tuple(self._finding(acc, primary=acc is top, ranked=ranked) for acc in ranked)
        if top is None:
            return Diagnosis(
                category=Category.NONE,
                failure_class=None,
                restartable=None,
                confidence=0.8 if not findings else 0.6,
                findings=findings,
                lines_read=self._lines,
                sources=tuple(self._sources),
            )
        primary = findings[ranked.index(top)]
        rivals = [a for a in ranked if a is not top and _can_be_primary(a) and _strength(a)[:3] == _strength(top)[:3]]
        confidence = primary.confidence - (0.15 if rivals else 0.0)
        return Diagnosis(
            category=primary.category,
            failure_class=primary.failure_class,
            restartable=primary.restartable,
            confidence=round(max(0.05, confidence), 2),
            primary=primary,
            findings=findings,
            lines_read=self._lines,
            sources=tuple(self._sources),
            attribution=attribution,
        )

    def _attribute(self) -> tuple[Attribution, set[Category]]:
        """The live attribution of the findings, and the categories of the findings it rests on.

        The job's nodes are the ones the findings name (the logs are all there is); no node state, no GPU agent.
        """
        nodes = tuple(sorted({f.node for f in self._findings if f.node}))
        facts = AttributionFacts.from_findings(nodes, self._findings, ranks_logging=self._ranks)
        return attribute(facts), {self._categories[f.order] for f in deciding_findings(facts)}

    # ----- one line ---------------------------------------------------------------------------------------------

    def _line(self, path: str, number: int, text: str, rank_of_file: int | None) -> None:
        self._lines += 1
        read = self._reader.read(path, text, rank=rank_of_file)
        prep = read.prep
        rank = rank_of_file if rank_of_file is not None else prep.rank
        self._see(path, number, prep, rank)
        body = prep.body
        block = self._blocks.get(path)
        if block is not None:
            self._in_block(path, block, body)
        elif SummaryBlock.starts_tail(body):
            block = self._blocks[path] = SummaryBlock()  # a summary entry whose header was cut off
            self._in_block(path, block, body)
        hit = read.hit
        if hit is None or read.fields is None:
            return
        if hit.signature.id == "elastic_root_cause":
            self._close_block(path)
            self._blocks[path] = SummaryBlock()
        self._seq += 1
        block = self._blocks.get(path)
        if block is not None:
            block.categories.add(hit.category)
        evidence = EvidenceLine(path=path, line=number, text=_clip(text.strip()))
        self._add(hit, read.fields._asdict(), evidence, in_block=block is not None)
        self._keep_finding(path, number, text, rank, read)

    def _keep_finding(self, path: str, number: int, text: str, rank: int | None, read: LineRead) -> None:
        """Keep the line's findings as the live path has them (the line number stands for the byte offset)."""
        if len(self._findings) >= _MAX_FINDINGS:
            return
        prefix = split_prefix(text)
        line = LogLine(
            path=path,
            rank=rank,
            text=text,
            offset=number,
            at=prefix.at,
            task=prefix.label,
            rank_is_task=rank is not None and rank == prefix.label and prefix.torch_rank is None,
        )
        found = to_findings(crash_findings(line, read), start_order=len(self._findings))
        self._findings += found
        self._categories += [read.hit.category if read.hit is not None else Category.NONE] * len(found)

    def _see(self, path: str, number: int, prep: Prepared, rank: int | None) -> None:
        """Note whose log this is (every line, matched or not): ranks, nodes, GPUs, a shell prompt's host."""
        body = prep.body
        rank = rank if rank is not None else rank_token(body)
        if rank is not None and len(self._ranks) < _MAX_RANKS:
            self._ranks.add(rank)
        ctx = self._files.get(path)
        if ctx is not None:
            ctx.see_line(number, prep, rank)

    def _in_block(self, path: str, block: SummaryBlock, body: str) -> None:
        if not block.read(body):
            self._close_block(path)

    def _close_block(self, path: str) -> None:
        block = self._blocks.pop(path, None)
        typed = block_fields(block.fields) if block is not None else {}
        if block is None or not typed:
            return
        when = block.fields.get("time", "")
        for category in block.categories:
            acc = self._acc.get(category)
            # torchrun prints one block per failed process: the earliest is the first observed failure.
            if acc is not None and (acc.block is None or (when and acc.block[0] and when < acc.block[0])):
                acc.block = (when, typed)

    def _add(self, hit: SignatureMatch, fields: dict[str, object], evidence: EvidenceLine, *, in_block: bool) -> None:
        acc = self._acc.get(hit.category)
        if acc is None:
            acc = self._acc[hit.category] = _Acc(hit.category, self._seq)
        acc.lines += 1
        strong = not hit.signature.weak
        acc.strong = acc.strong or strong
        acc.roles.add(hit.role)
        key = (int(strong), _ROLE_RANK[hit.role])
        if acc.best is None or key > acc.best.key:
            acc.best = _Best(key, hit, fields, evidence.path, evidence.line, in_block)
        ranks = fields.get("ranks") or (fields.get("rank"),)
        for rank in ranks if isinstance(ranks, tuple) else ():
            if isinstance(rank, int) and len(acc.ranks) < _MAX_RANKS:
                acc.ranks.add(rank)
        host = fields.get("host")
        if isinstance(host, str) and len(acc.hosts) < _MAX_HOSTS:
            acc.hosts.add(host)
        for name in _FIELDS:
            value = fields.get(name)
            if value is not None and len(acc.seen[name]) < 2:
                acc.seen[name].add(value)
        if len(acc.evidence) < self._max_evidence:
            acc.evidence.append(evidence)

    # ----- verdict ----------------------------------------------------------------------------------------------

    def _finding(self, acc: _Acc, *, primary: bool, ranked: list[_Acc]) -> Finding:
        assert acc.best is not None  # callers filter
        hit = acc.best.hit
        fields = self._fill_finding(acc, ranked if primary else [])
        tier = CATEGORIES[acc.category].tier
        confidence = _BASE_CONFIDENCE[tier] - (0.25 if not acc.strong else 0.0)
        confidence -= 0.1 if hit.role is not Role.CULPRIT and tier >= 4 else 0.0
        confidence += 0.05 * (acc.lines > 1) + 0.05 * (len(acc.ranks) > 1)
        gpu = fields.get("gpu")
        return Finding(
            category=acc.category,
            signature=hit.signature.id,
            failure_class=hit.failure_class,
            restartable=hit.restartable,
            role=hit.role,
            confidence=round(min(0.99, max(0.05, confidence)), 2),
            rank=_opt_int(fields.get("rank")),
            host=_opt_str(fields.get("host")),
            gpu=normalize_gpu(gpu) if isinstance(gpu, str | int) else None,
            peer_rank=_opt_int(fields.get("peer_rank")),
            xid=_opt_int(fields.get("xid")),
            exit_code=_opt_int(fields.get("exit_code")),
            signal=_opt_int(fields.get("signal")),
            exception=_opt_str(fields.get("exception")),
            message=_clip(str(fields.get("message") or "")),
            detail=hit.detail,
            ranks=tuple(sorted(acc.ranks)),
            hosts=tuple(sorted(acc.hosts)),
            lines=acc.lines,
            weak=not acc.strong,
            evidence=tuple(acc.evidence),
        )

    def _fill_finding(self, acc: _Acc, summaries: list[_Acc]) -> dict[str, object]:
        """The representative line's fields, completed from what else the logs say about the same failure.

        In order: the torchrun block the line sits in; the category's other lines, where they all agree; for the
        root cause, the launchers' summaries of one process (torchrun's root cause, a DeepSpeed or srun exit) that
        do not name another rank; the file's own identity (a per-rank log names one rank, node and GPU); a shell
        prompt's host; for a GPU error, the PCI id of an ``NVRM:`` line just above (the kernel wraps messages).
        """
        assert acc.best is not None
        fields = dict(acc.best.fields)
        if acc.block is not None:
            if acc.best.in_block:  # which block a line sat in matters less than which process failed first
                fields.update({k: v for k, v in acc.block[1].items() if v is not None})
            _fill(fields, acc.block[1])
        _fill(fields, {name: next(iter(v)) for name, v in acc.seen.items() if len(v) == 1})
        for other in summaries:
            if other is acc or CATEGORIES[other.category].tier > 2 or len(other.seen["rank"]) > 1:
                continue
            theirs = self._fill_finding(other, [])
            if fields.get("rank") is None or theirs.get("rank") in (None, fields.get("rank")):
                _fill(fields, {name: theirs.get(name) for name in _FIELDS})
        ctx = self._files.get(acc.best.path)
        if ctx is not None:
            _fill(fields, {name: ctx.only(name) for name in ("rank", "host", "gpu")})
            _fill(fields, {"host": ctx.prompt_host})
            near = ctx.pci is not None and 0 <= acc.best.line - ctx.pci[0] <= 3
            if near and acc.best.hit.signature.kind in (FindingKind.CUDA_ERROR, FindingKind.XID) and ctx.pci:
                _fill(fields, {"gpu": ctx.pci[1]})
        return fields


_ROLE_RANK = {Role.CULPRIT: 2, Role.VICTIM: 1, Role.INFO: 0}


def _strength(acc: _Acc) -> tuple[int, int, int, int]:
    """Root-cause order: tier, specific over catch-all, culprit over victim, then the earliest."""
    assert acc.best is not None
    return (CATEGORIES[acc.category].tier, int(acc.strong), acc.best.key[1], -acc.first_seq)


def _can_be_primary(acc: _Acc) -> bool:
    """Not context, and not srun's "Terminated" alone: stopping the survivors follows a cause, it is not one (with
    nothing else in the logs the job was cancelled or requeued, not failed)."""
    if acc.best is None or acc.category is Category.NONE:
        return False
    return not (CATEGORIES[acc.category].tier == 1 and acc.roles == {Role.VICTIM})


def _fill(fields: dict[str, object], more: Mapping[str, object]) -> None:
    """Set each field of ``more`` that ``fields`` lacks."""
    for name, value in more.items():
        if value is not None and fields.get(name) is None:
            fields[name] = value


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def diagnose_text(text: str, *, path: str = "<text>") -> Diagnosis:
    """The diagnosis of one log given as a string (the benchmark's corpus cases, tests)."""
    diagnoser = Diagnoser()
    diagnoser.feed(path, split_text(text))
    return diagnoser.result()
