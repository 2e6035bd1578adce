"""What a matched log line implicates (``extract``): the row's named groups first, then what the line says around
them (its prefixes, a ``node=`` token, a message's own words such as ``GPU 0 has a total capacity``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from activities.logs.line import rank_token
from activities.logs.signature_types import EXCEPTION_NAME, PCI_ID, Prepared, SignatureMatch
from workflows.domain.findings import FindingKind

__all__ = ["Fields", "extract", "signal_number"]

_SIGNALS = {
    "Segmentation fault": 11,
    "Bus error": 7,
    "Killed": 9,
    "Aborted": 6,
    "Floating point exception": 8,
    "Illegal instruction": 4,
    "Terminated": 15,
}
_MAX_TASKS = 4096

_SYSLOG_HOST = re.compile(
    r"^(?:[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d )?(?P<host>[\w.\-]+) (?:kernel|slurmd|slurmstepd)(?:\[\d+\])?: "
)
_NODE_IN_LINE = re.compile(r"(?<![\w.])node=(?P<host>[\w.\-]+)")
_LEADING_EXC = re.compile(r"^" + EXCEPTION_NAME + r":\s*")
# What a message names in its own words ("GPU 0 has a total capacity", "Rank 11: found NaN ... node: n7"), read
# for a matched line when neither the row's groups nor the prefixes gave it.
_HINTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "gpu",
        re.compile(
            r"\(GPU (\d+);|\bGPU (\d+) has a total capac|\bDevice:? (\d+)\b|\bCUDA device (\d+)\b|device ordinal (\d+)"
        ),
    ),
    ("pci", re.compile(rf"(?<![\w:])({PCI_ID})(?![\w:])")),
    ("host", re.compile(r"\bnode: ([\w\-]+(?:\.[\w\-]+)*)|\bon host ([\w.\-]+)|\bhostname[=:] ?([\w.\-]+)")),
    ("exit_code", re.compile(r"\bexit ?code:? (-?\d+)|\bexit status (-?\d+)|return code = (-?\d+)")),
    ("rank", re.compile(r"\bRank (\d+)\]|\bRank (\d+): |\bon rank (\d+)\b|\bglobal rank (\d+)\b")),
)


def signal_number(text: str) -> int | None:
    """``11`` or ``Segmentation fault`` -> 11; None for a name that is not a signal's."""
    text = text.strip()
    return int(text) if text.isdigit() else _SIGNALS.get(text)


# ----- fields ---------------------------------------------------------------------------------------------------


class Fields(NamedTuple):
    """What one matched line implicates; None where it says nothing."""

    ranks: tuple[int, ...] | None
    """From a Slurm task list (``tasks 0,2-3``); None without one, ``()`` when the list is implausible."""
    rank: int | None
    host: str | None
    gpu: str | None
    peer_rank: int | None
    xid: int | None
    exit_code: int | None
    signal: int | None
    exception: str | None
    message: str


def extract(hit: SignatureMatch, prep: Prepared, *, rank: int | None = None, host: str | None = None) -> Fields:
    """The fields of a matched line: the row's groups first, then the line's prefixes.

    Args:
        hit: What ``match`` returned for ``prep.body``.
        prep: The prepared line.
        rank: The rank the reader already knows for the line (e.g. from its file name), preferred to the
            prefixes' one.
        host: The host the reader already knows (e.g. ``%N`` in a file pattern), preferred to the prefixes'.
    """
    g, body, sig = hit.groups, prep.body, hit.signature
    exception, message = g.get("exception"), g.get("message")
    leading = _LEADING_EXC.match(body)
    if exception is None and leading is not None:
        exception = leading.group("exception")
    if message is None and leading is not None:
        message = body[leading.end() :]
    elif message is None:
        # A bare "AssertionError" has no message; any other line is its own message.
        message = "" if "exception" in g else body
    node = g.get("host")
    if node is None and sig.node_fallback:
        node = host or prep.host
    exit_code = int(g["exit_code"]) if "exit_code" in g else None
    signal = signal_number(g["signal"]) if "signal" in g else None
    if signal is None:
        signal = sig.signal
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code  # torchrun and Python's subprocess report death by signal N as -N
    line_rank = rank if rank is not None else prep.rank
    if exit_code is None:
        exit_code = _int(_hints(body).get("exit_code"))
    if line_rank is None:
        line_rank = rank_token(body)
    if node is None and sig.node_fallback:
        m = _SYSLOG_HOST.match(body) or _NODE_IN_LINE.search(body)
        node = m.group("host") if m is not None else None
    gpu = g.get("gpu") or prep.gpu
    if gpu is None or line_rank is None or (node is None and sig.node_fallback):
        hints = _hints(body)
        gpu = gpu or hints.get("gpu")
        if sig.kind in (FindingKind.CUDA_ERROR, FindingKind.XID):  # a NIC's or a disk's PCI id is not a GPU
            gpu = gpu or hints.get("pci")
        line_rank = line_rank if line_rank is not None else _int(hints.get("rank"))
        node = node if node is not None or not sig.node_fallback else hints.get("host")
    ranks = _task_list(g["ranks"]) if "ranks" in g else None
    if ranks:
        line_rank = ranks[0]  # srun names the task: the rank is certain
    return Fields(
        ranks=ranks,
        rank=int(g["rank"]) if "rank" in g else line_rank,
        host=node,
        gpu=gpu,
        peer_rank=int(g["peer_rank"]) if "peer_rank" in g else None,
        xid=int(g["xid"]) if "xid" in g else None,
        exit_code=exit_code,
        signal=signal,
        exception=exception,
        message=message.strip(),
    )


def _hints(body: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, regex in _HINTS:
        if name in found:
            continue
        m = regex.search(body)
        if m is not None:
            found[name] = next(v for v in m.groups() if v is not None)
    return found


def _int(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _task_list(text: str) -> tuple[int, ...]:
    """``0,2-3`` -> ``(0, 2, 3)``; ``()`` when it is malformed or implausibly long."""
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo or (hi == "" and part.endswith("-")):
            return ()
        first, last = int(lo), int(hi or lo)
        if last < first or len(ranks) + last - first >= _MAX_TASKS:
            return ()
        ranks.extend(range(first, last + 1))
    return tuple(ranks)
