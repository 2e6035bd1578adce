"""Root cause of a failed job from its logs: every line through the signature library, then one verdict. Pure.

``Diagnoser`` is fed lines, one file (or stdin) at a time, and keeps only a bounded summary: one ``Finding`` per
category, at most ``MAX_EVIDENCE`` evidence lines each, lines cut at ``tail.DEFAULT_MAX_BYTES_PER_FILE`` bytes.
``result()`` then picks the root cause, by these rules in order:

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

Multi-line awareness, per file and rank (interleaved ranks keep separate state):

* a traceback's source lines (the indented line after ``File "...", line N``) are code, not messages: skipped;
* a traceback printed under ``Exception ignored in:`` (a destructor's complaint) is not the job's error: its final
  exception line is dropped (a CUDA error there still counts: it is the device's, not the destructor's);
* torchrun's summary blocks (``Root Cause (first observed failure)``, a failure's ``[n]:`` entry, or their tail
  when the header was cut off): their ``rank``, ``host`` and ``exitcode`` lines are given to the block's findings,
  and of several blocks the earliest ``time`` is the first failure.

What the root cause's own line does not say (rank, host, GPU, exit code, signal) is taken from the same failure's
other lines, then from the launchers' summaries of one process, then from its file (see ``_fill_finding``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from pydantic import Field

from activities.logs.signatures import (
    CATEGORIES,
    Category,
    Prepared,
    Role,
    SignatureMatch,
    extract,
    match,
    prepare,
)
from activities.logs.tail import DEFAULT_MAX_BYTES_PER_FILE, rank_token
from workflows.domain.base import Frozen
from workflows.domain.findings import FindingKind
from workflows.domain.incident import FailureClass

__all__ = [
    "MAX_EVIDENCE",
    "Diagnoser",
    "Diagnosis",
    "EvidenceLine",
    "Finding",
    "diagnose_text",
    "file_rank",
    "normalize_gpu",
    "read_lines",
]

MAX_EVIDENCE = 5
"""Evidence lines kept per finding: the first ones, where a failure shows first."""
MAX_TEXT = 300
"""Characters of an evidence line kept."""
_MAX_RANKS = 4096
_MAX_HOSTS = 256
_MAX_KEYS = 4096
_CHUNK = 1 << 16

_EOL = re.compile(rb"\r\n|\r|\n")
# The file-name rule of LogTail (rank-3.log, rank_3, rank.3, rank3; never local_rank).
_NAME_RANK = re.compile(r"(?<![a-z])(?<!local_)(?<!local-)rank[-_.]?(\d+)(?!\d)", re.IGNORECASE)
_FILE_LINE = re.compile(r'^\s+File "')
_IGNORED = re.compile(r"^Exception ignored (?:in|on calling)\b")
_TRACEBACK_LINE = re.compile(r"^(?:\s|Traceback \(most recent call last\)|During handling|The above exception)")
# torchrun's aligned summary fields: "  rank      : 3 (local_rank: 3)", "  exitcode  : -9 (pid: 1237)"
_BLOCK_FIELD = re.compile(r"^\s+(?P<name>time|host|rank|exitcode|error_file|traceback)\s*: (?P<value>.*)$")
_IDENTITY = re.compile(r"(?<![\w.])(?:node=(?P<node>[\w.\-]+)|gpu=(?P<gpu>\d+))\b")
# A pasted shell prompt names the host the next commands ran on: "[alice@gpu-n7 ~]$", "zeyer@cn-234 ~ %"
_PROMPT = re.compile(r"^\[?[\w.\-]+@(?P<host>[A-Za-z][\w\-]*(?:\.[\w\-]+)*)(?=[ :~\]])")
_PCI_IN_TEXT = re.compile(r"(?<![\w:])((?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?![\w:])")
_BLOCK_INDEX = re.compile(r"^\s*\[\d+\]:\s*$")
_PCI = re.compile(r"^(?:pci:)?(?:[0-9a-f]{4})?([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")
# Confidence by tier (signatures.CategoryInfo.tier): hardware evidence, a rank's own error, communication, summaries.
_BASE_CONFIDENCE = {6: 0.9, 5: 0.9, 4: 0.85, 3: 0.55, 2: 0.45, 1: 0.35, 0: 0.2}


class EvidenceLine(Frozen):
    path: str
    line: int
    """1-based line number in ``path``."""
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


class Finding(Frozen):
    """Everything the logs say about one failure category: the best line's fields, and where it was seen."""

    category: Category
    signature: str
    """The id of the row that matched the representative line."""
    failure_class: FailureClass | None
    restartable: bool | None
    """Whether a restart (elsewhere) can help; None when the category says nothing (``none``)."""
    role: Role
    confidence: float = Field(ge=0, le=1)
    rank: int | None = None
    host: str | None = None
    gpu: int | str | None = None
    """A GPU index, or a PCI id (``0000:3b:00.0``)."""
    peer_rank: int | None = None
    xid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    exception: str | None = None
    message: str = ""
    detail: str = ""
    """Why, where the table alone does not say: the XID catalog's meaning and recommended action."""
    ranks: tuple[int, ...] = ()
    """Every rank that reported it (sorted)."""
    hosts: tuple[str, ...] = ()
    lines: int = 0
    """Lines that matched."""
    weak: bool = False
    """Only catch-all rows matched (an unknown exception type, a CUDA error without a known name)."""
    evidence: tuple[EvidenceLine, ...] = ()


class Diagnosis(Frozen):
    """The root cause (``primary``) and everything else found, strongest first."""

    category: Category
    failure_class: FailureClass | None
    restartable: bool | None
    confidence: float = Field(ge=0, le=1)
    primary: Finding | None = None
    findings: tuple[Finding, ...] = ()
    lines_read: int = 0
    sources: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.category is not Category.NONE


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


class _Stream:
    """What one (file, rank) is in the middle of: a traceback's source line, an ignored exception."""

    def __init__(self) -> None:
        self.after_file_line = False
        self.ignoring = False


class _FileContext:
    """What a whole file says about whose log it is: a per-rank file names one rank (and node, GPU) throughout."""

    def __init__(self, rank: int | None) -> None:
        self.values: dict[str, set[object]] = {"rank": set(), "host": set(), "gpu": set()}
        if rank is not None:
            self.values["rank"].add(rank)
        self.prompt_host: str | None = None
        self.pci: tuple[int, str] | None = None
        """The last PCI id an ``NVRM:`` line named, with its line number: the kernel wraps long messages."""

    def see(self, name: str, value: object) -> None:
        if value is not None and len(self.values[name]) < 2:
            self.values[name].add(value)

    def only(self, name: str) -> object:
        values = self.values[name]
        return next(iter(values)) if len(values) == 1 else None


class _Block:
    """A torchrun summary block being read (``Root Cause`` or a failure's ``[n]:`` entry): fields and findings."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.categories: set[Category] = set()
        self.lines = 0


class Diagnoser:
    """Streams lines in, keeps a bounded summary, and gives the ``Diagnosis`` (module docstring)."""

    def __init__(self, *, max_evidence: int = MAX_EVIDENCE) -> None:
        self._max_evidence = max(1, max_evidence)
        self._acc: dict[Category, _Acc] = {}
        self._streams: dict[tuple[str, int | None], _Stream] = {}
        self._files: dict[str, _FileContext] = {}
        self._blocks: dict[str, _Block] = {}
        self._seq = 0
        self._lines = 0
        self._sources: list[str] = []

    def feed(self, path: str, lines: Iterable[str]) -> None:
        """Read every line of one source (a file, stdin), numbered from 1."""
        self._sources.append(path)
        rank_of_file = file_rank(path)
        if len(self._files) >= _MAX_KEYS:
            self._files.clear()  # bounded memory: a pathological number of sources loses only file identities
        self._files.setdefault(path, _FileContext(rank_of_file))
        for number, text in enumerate(lines, start=1):
            self._line(path, number, text, rank_of_file)

    def result(self) -> Diagnosis:
        """The diagnosis of everything fed so far."""
        for path in list(self._blocks):
            self._close_block(path)
        ranked = sorted((a for a in self._acc.values() if a.best is not None), key=_strength, reverse=True)
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
        )

    # ----- one line ---------------------------------------------------------------------------------------------

    def _line(self, path: str, number: int, text: str, rank_of_file: int | None) -> None:
        self._lines += 1
        prep = prepare(text)
        rank = rank_of_file if rank_of_file is not None else prep.rank
        body = prep.body
        self._see(path, number, prep, rank)
        stream = self._stream(path, rank)
        code_line = stream.after_file_line and body[:1] in (" ", "\t")
        stream.after_file_line = _FILE_LINE.match(body) is not None
        block = self._blocks.get(path)
        if block is not None:
            self._in_block(path, block, body)
        elif _BLOCK_FIELD.match(body):
            block = self._blocks[path] = _Block()  # a summary entry whose header was cut off
            self._in_block(path, block, body)
        if code_line:
            return
        if _IGNORED.match(body):
            stream.ignoring = True
            return
        hit = match(body)
        if stream.ignoring:
            if hit is not None and hit.category is Category.USER_EXCEPTION:
                stream.ignoring = False
                return
            if not _TRACEBACK_LINE.match(body):
                stream.ignoring = False
        if hit is None:
            return
        if hit.signature.id == "elastic_root_cause":
            self._close_block(path)
            self._blocks[path] = _Block()
        self._seq += 1
        fields = extract(hit, prep, rank=rank)._asdict()
        block = self._blocks.get(path)
        if block is not None:
            block.categories.add(hit.category)
        evidence = EvidenceLine(path=path, line=number, text=_clip(text.strip()))
        self._add(hit, fields, evidence, in_block=block is not None)

    def _see(self, path: str, number: int, prep: Prepared, rank: int | None) -> None:
        """Note whose log this is (every line, matched or not): ranks, nodes, GPUs, a shell prompt's host."""
        ctx = self._files.get(path)
        if ctx is None:
            return
        body = prep.body
        ctx.see("rank", rank if rank is not None else rank_token(body))
        ctx.see("host", prep.host)
        for m in _IDENTITY.finditer(body):
            if m.group("node") is not None:
                ctx.see("host", m.group("node"))
            else:
                ctx.see("gpu", int(m.group("gpu")))
        prompt = _PROMPT.match(body)
        if prompt is not None:
            ctx.prompt_host = prompt.group("host")
        if "NVRM" in body:
            pci = _PCI_IN_TEXT.search(body)
            if pci is not None:
                ctx.pci = (number, pci.group(1))

    def _stream(self, path: str, rank: int | None) -> _Stream:
        key = (path, rank)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= _MAX_KEYS:
                self._streams.clear()  # bounded memory: a pathological log loses only multi-line context
            stream = self._streams[key] = _Stream()
        return stream

    def _in_block(self, path: str, block: _Block, body: str) -> None:
        """Read one line of an open summary block (``[0]:``, then ``name : value`` lines); close it at its end."""
        block.lines += 1
        m = _BLOCK_FIELD.match(body)
        if m is not None:
            block.fields[m.group("name")] = m.group("value").strip()
        elif not (_BLOCK_INDEX.match(body) or (block.lines == 1 and not block.fields)):
            self._close_block(path)
        if block.lines > 12:
            self._close_block(path)

    def _close_block(self, path: str) -> None:
        block = self._blocks.pop(path, None)
        typed = _block_fields(block.fields) if block is not None else {}
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


def _block_fields(block: dict[str, str]) -> dict[str, object]:
    """torchrun's ``rank : 3 (local_rank: 3)``, ``host : n1``, ``exitcode : -9 (pid: 1)`` as typed fields."""
    out: dict[str, object] = {}
    for name, key in (("rank", "rank"), ("exit_code", "exitcode")):
        m = re.match(r"-?\d+", block.get(key, ""))
        if m is not None:
            out[name] = int(m.group())
    if block.get("host"):
        out["host"] = block["host"].split()[0]
    code = out.get("exit_code")
    if isinstance(code, int) and code < 0:
        out["signal"] = -code  # torchrun reports death by signal N as -N
    return out


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


def normalize_gpu(value: str | int) -> int | str:
    """A GPU as an index (``3``) or a canonical PCI id (``0000:3b:00.0``): what the logs and labels spell apart.

    ``0000:3B:00`` (NVRM), ``00000000:3B:00.0`` (nvidia-smi) and ``PCI:0000:3b:00.0`` are one GPU.
    """
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    m = _PCI.match(text.lower())
    if m is None:
        return text
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4) or '0'}"


def file_rank(path: str) -> int | None:
    """The rank a file's name gives its lines (``rank-3.log``), by ``LogTail``'s rule; None without one."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    m = _NAME_RANK.search(base)
    return int(m.group(1)) if m else None


def read_lines(stream: BinaryIO, *, max_line: int = DEFAULT_MAX_BYTES_PER_FILE) -> Iterator[str]:
    """The lines of a binary stream, decoded (U+FFFD for bad bytes), read in chunks: memory stays bounded.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r``; empty lines are skipped; a line longer than ``max_line`` bytes is
    returned in pieces of that size, like ``LogTail`` does.
    """
    max_line = max(1, max_line)
    pending = b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        data = pending + chunk
        pos = 0
        for m in _EOL.finditer(data):
            if m.end() == len(data) and m.group() == b"\r":
                break  # maybe the first half of a \r\n
            yield from _pieces(data[pos : m.start()], max_line)
            pos = m.end()
        pending = data[pos:]
        while len(pending) > max_line:
            yield pending[:max_line].decode("utf-8", errors="replace")
            pending = pending[max_line:]
    yield from _pieces(pending.rstrip(b"\r"), max_line)


def _pieces(raw: bytes, max_line: int) -> Iterator[str]:
    for start in range(0, len(raw), max_line):
        yield raw[start : start + max_line].decode("utf-8", errors="replace")


def diagnose_text(text: str, *, path: str = "<text>") -> Diagnosis:
    """The diagnosis of one log given as a string (the benchmark's corpus cases, tests)."""
    diagnoser = Diagnoser()
    diagnoser.feed(path, (line for line in re.split(r"\r\n|\r|\n", text) if line))
    return diagnoser.result()
