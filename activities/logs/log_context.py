"""What the lines around a finding say about it, for ``rebound diagnose``'s summary of whole logs.

``FileContext`` is whose log a file is (a per-rank file names one rank, node and GPU throughout; a pasted shell
prompt names the host; an ``NVRM:`` line names the PCI id the kernel's next, wrapped line is about).
``SummaryBlock`` is one of torchrun's summary blocks (``Root Cause (first observed failure)``, a failure's ``[n]:``
entry, or their tail when the header was cut off), read line by line: its ``rank``, ``host`` and ``exitcode``
lines belong to the findings inside it (``block_fields``).
"""

from __future__ import annotations

import re

from activities.logs.signature_types import Category, Prepared

__all__ = ["FileContext", "SummaryBlock", "block_fields"]

# torchrun's aligned summary fields: "  rank      : 3 (local_rank: 3)", "  exitcode  : -9 (pid: 1237)"
_BLOCK_FIELD = re.compile(r"^\s+(?P<name>time|host|rank|exitcode|error_file|traceback)\s*: (?P<value>.*)$")
_BLOCK_INDEX = re.compile(r"^\s*\[\d+\]:\s*$")
_MAX_BLOCK_LINES = 12
_IDENTITY = re.compile(r"(?<![\w.])(?:node=(?P<node>[\w.\-]+)|gpu=(?P<gpu>\d+))\b")
# A pasted shell prompt names the host the next commands ran on: "[alice@gpu-n7 ~]$", "zeyer@cn-234 ~ %"
_PROMPT = re.compile(r"^\[?[\w.\-]+@(?P<host>[A-Za-z][\w\-]*(?:\.[\w\-]+)*)(?=[ :~\]])")
_PCI_IN_TEXT = re.compile(r"(?<![\w:])((?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?![\w:])")


class FileContext:
    """What a whole file says about whose log it is: a per-rank file names one rank (and node, GPU) throughout."""

    def __init__(self, rank: int | None) -> None:
        self.values: dict[str, set[object]] = {"rank": set(), "host": set(), "gpu": set()}
        if rank is not None:
            self.values["rank"].add(rank)
        self.prompt_host: str | None = None
        self.pci: tuple[int, str] | None = None
        """The last PCI id an ``NVRM:`` line named, with its line number: the kernel wraps long messages."""

    def see_line(self, number: int, prep: Prepared, rank: int | None) -> None:
        """Note what line ``number`` (matched or not) says of its rank, node, GPU, a shell prompt's host."""
        body = prep.body
        self.see("rank", rank)
        self.see("host", prep.host)
        for m in _IDENTITY.finditer(body):
            if m.group("node") is not None:
                self.see("host", m.group("node"))
            else:
                self.see("gpu", int(m.group("gpu")))
        prompt = _PROMPT.match(body)
        if prompt is not None:
            self.prompt_host = prompt.group("host")
        if "NVRM" in body:
            pci = _PCI_IN_TEXT.search(body)
            if pci is not None:
                self.pci = (number, pci.group(1))

    def see(self, name: str, value: object) -> None:
        if value is not None and len(self.values[name]) < 2:
            self.values[name].add(value)

    def only(self, name: str) -> object:
        """The one value the file gave ``name``; None when it gave none or several."""
        values = self.values[name]
        return next(iter(values)) if len(values) == 1 else None


class SummaryBlock:
    """A torchrun summary block being read (``Root Cause`` or a failure's ``[n]:`` entry): fields and findings."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.categories: set[Category] = set()
        """The categories of the findings inside the block."""
        self.lines = 0

    @staticmethod
    def starts_tail(body: str) -> bool:
        """A ``name : value`` line outside a block: the tail of a summary entry whose header was cut off."""
        return _BLOCK_FIELD.match(body) is not None

    def read(self, body: str) -> bool:
        """Read one line of the block (``[0]:``, then ``name : value`` lines); False once the block has ended."""
        self.lines += 1
        m = _BLOCK_FIELD.match(body)
        if m is not None:
            self.fields[m.group("name")] = m.group("value").strip()
        elif not (_BLOCK_INDEX.match(body) or (self.lines == 1 and not self.fields)):
            return False
        return self.lines <= _MAX_BLOCK_LINES


def block_fields(block: dict[str, str]) -> dict[str, object]:
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
