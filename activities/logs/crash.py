"""Crash evidence in log lines: a table of rules, each a regex that says what a matching line means.

The table (``CRASH_RULES``) is the whole classifier; ``classify`` is a loop over it. For each line the **first**
rule whose regex matches the line's body (the text after its srun label, ``[rankN]:`` prefix and timestamp)
wins, so order is precedence: specific srun lines before generic signal words, CUDA and communication errors
before the generic Python exception rule (a gloo ``RuntimeError`` is a victim, not a user bug). A rule yields
one finding, or one per rank when it names a Slurm task list (``tasks 2-3``).

What a rule extracts is the named groups of its regex:

* ``ranks`` (a task list: ``3``, ``2-3``, ``0,2-5``) or ``rank``; otherwise the line's own rank;
* ``node``; otherwise the ``%N`` node of the file, a ``slurmstepd-<node>:`` prefix or a ``node=`` token,
  unless the rule says the line's node is not the one to blame (``node_fallback=False``);
* ``exit_code``, ``signal`` (a number or a name such as ``Segmentation fault``), ``xid``;
* ``exception`` and ``message``; otherwise a leading ``SomeError:`` of the body and the rest of it;
* ``at`` (a timestamp inside the text, e.g. Slurm's ``CANCELLED AT ...``), used when the line has none.

Roles: a ``CULPRIT`` finding says this rank or node failed by itself; a ``VICTIM`` one that it failed because a
peer did (a gloo/NCCL peer error, srun terminating the survivors); ``INFO`` is context, not a crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from activities.logs.tail import LogLine, split_prefix
from workflows.domain.base import Frozen
from workflows.domain.incident import Evidence, EvidenceSource, FailureClass

__all__ = [
    "CRASH_RULES",
    "CrashFinding",
    "CrashKind",
    "CrashRule",
    "Role",
    "classify",
    "scan",
    "to_evidence",
]

MAX_TEXT = 300
_MAX_TASKS = 4096


class CrashKind(StrEnum):
    CUDA_ERROR = "cuda_error"
    XID = "xid"
    SEGFAULT = "segfault"
    FATAL_SIGNAL = "fatal_signal"
    """SIGABRT, SIGFPE, SIGILL: the process died of a signal it raised itself."""
    RANK_EXIT = "rank_exit"
    KILLED = "killed"
    COMM_ERROR = "comm_error"
    NODE_FAILURE = "node_failure"
    PYTHON_EXCEPTION = "python_exception"
    TERMINATED = "terminated"
    """srun (or Slurm) sent SIGTERM: the task was stopped, it did not fail."""
    REQUEUE = "requeue"
    CANCELLED = "cancelled"


class Role(StrEnum):
    CULPRIT = "culprit"
    VICTIM = "victim"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class CrashRule:
    """One row of the table: lines matching ``pattern`` mean ``kind``, with this class and role."""

    name: str
    pattern: re.Pattern[str]
    kind: CrashKind
    failure_class: FailureClass
    role: Role
    signal: int | None = None
    """The signal every match implies, when the regex has no ``signal`` group."""
    node_fallback: bool = True

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields this rule extracts itself (its regex's named groups)."""
        return tuple(self.pattern.groupindex)


class CrashFinding(Frozen):
    """One log line that says something crashed (or, for ``Role.INFO``, was stopped on purpose)."""

    rule: str
    kind: CrashKind
    failure_class: FailureClass
    role: Role
    culprit: bool
    """``role == Role.CULPRIT``, for readers that only need that."""
    text: str
    """The evidence line, stripped, at most ``MAX_TEXT`` characters."""
    path: str
    offset: int | None = None
    rank: int | None = None
    node: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    exception: str | None = None
    message: str = ""
    xid: int | None = None
    at: datetime | None = None


_H, _I, _U, _X = FailureClass.HARDWARE, FailureClass.INFRASTRUCTURE, FailureClass.USER, FailureClass.UNKNOWN
_C, _V, _N = Role.CULPRIT, Role.VICTIM, Role.INFO
_K = CrashKind


def _rule(
    name: str,
    regex: str,
    kind: CrashKind,
    failure_class: FailureClass,
    role: Role,
    *,
    signal: int | None = None,
    node_fallback: bool = True,
    flags: int = 0,
) -> CrashRule:
    return CrashRule(name, re.compile(regex, flags), kind, failure_class, role, signal, node_fallback)


# srun reports each task's end on its own stderr (the batch log): "srun: error: n1: tasks 0-1: Killed".
_SRUN_TASK = r"^srun: error: (?P<node>[\w.\-]+): tasks? (?P<ranks>\d+(?:[-,]\d+)*): "
_STEPD = r"\*\*\* (?:JOB|STEP) [\w.+]+ ON [\w.\-]+ CANCELLED AT (?P<at>\S+)"
_EXC = r"(?P<exception>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"

CRASH_RULES: tuple[CrashRule, ...] = (
    # --- srun's verdict on each task: rank and node are certain ---
    _rule("srun_task_oom", _SRUN_TASK + r"Out Of Memory", _K.KILLED, _X, _C, signal=9),
    _rule("srun_task_segfault", _SRUN_TASK + r"(?P<signal>Segmentation fault|Bus error)", _K.SEGFAULT, _X, _C),
    _rule("srun_task_killed", _SRUN_TASK + r"Killed", _K.KILLED, _X, _C, signal=9),
    _rule(
        "srun_task_signal",
        _SRUN_TASK + r"(?P<signal>Aborted|Floating point exception|Illegal instruction)",
        _K.FATAL_SIGNAL,
        _X,
        _C,
    ),
    # srun stops the remaining tasks after one failed (or on cancel/requeue): they are not the cause.
    _rule("srun_task_terminated", _SRUN_TASK + r"Terminated", _K.TERMINATED, _X, _V, signal=15),
    _rule("srun_task_exit", _SRUN_TASK + r"Exited with exit code (?P<exit_code>\d+)", _K.RANK_EXIT, _X, _C),
    # --- lost nodes ---
    _rule("srun_node_failure", r"^srun: error: Node failure on (?P<node>[\w.\-]+)", _K.NODE_FAILURE, _I, _C),
    _rule(
        "srun_launch_failed",
        r"^srun: error: Task launch for \S+ failed on node (?P<node>[\w.\-]+)",
        _K.NODE_FAILURE,
        _I,
        _C,
    ),
    # The "ON <node>" of a stepd line is where that stepd runs, typically a survivor: never blame it.
    _rule("stepd_node_failure", _STEPD + r" DUE TO NODE FAIL", _K.NODE_FAILURE, _I, _C, node_fallback=False),
    _rule("node_fail_state", r"\bNODE_FAIL\b", _K.NODE_FAILURE, _I, _C, node_fallback=False),
    # --- Slurm stopping the job on purpose: context for the timeline, not a crash ---
    _rule("stepd_requeue", _STEPD + r" DUE TO (?P<message>JOB REQUEUE|PREEMPTION)", _K.REQUEUE, _X, _N),
    _rule("stepd_cancelled", _STEPD + r"(?: DUE TO (?P<message>[^*]+?))? \*\*\*", _K.CANCELLED, _X, _N),
    # --- GPU ---
    _rule("nvrm_xid", r"NVRM: Xid \([^)]*\): (?P<xid>\d+)", _K.XID, _H, _C),
    # Out of device memory and device-side asserts (an index out of range in a kernel) are the program's doing.
    _rule("cuda_oom", r"CUDA (?:error: )?out of memory", _K.CUDA_ERROR, _U, _C),
    _rule("cuda_device_assert", r"device-side assert(?:ion)? triggered", _K.CUDA_ERROR, _U, _C),
    _rule(
        "cuda_error",
        r"CUDA error: (?P<message>.+)|unhandled cuda error|ncclUnhandledCudaError|uncorrectable ECC error"
        r"|an illegal memory access was encountered|unspecified launch failure|GPU has fallen off the bus",
        _K.CUDA_ERROR,
        _H,
        _C,
    ),
    # --- a peer died or hung: this rank is a victim; the class is the peer's ---
    _rule("peer_lost", r"Connection (?:closed|reset) by peer", _K.COMM_ERROR, _X, _V),
    _rule(
        "collective_timeout",
        r"Timed out waiting \d+ ?ms for (?:recv|send) operation|Watchdog caught collective operation timeout"
        r"|ProcessGroupNCCL's watchdog|NCCL communicator was aborted|Some NCCL operations have failed or timed out",
        _K.COMM_ERROR,
        _X,
        _V,
    ),
    _rule(
        "nccl_remote_error",
        r"ncclRemoteError|remote process exited or there was a network error|unhandled system error"
        r"|NET/IB ?: .*(?:error|failed)",
        _K.COMM_ERROR,
        _X,
        _V,
    ),
    _rule(
        "c10d_error",
        r"\bDist(?:Backend|Network|Store)Error\b|client socket has timed out|Gloo connectFullMesh failed"
        r"|ProcessGroupGloo\w*::\w+.*(?:failed|timed out|Timeout|error)",
        _K.COMM_ERROR,
        _X,
        _V,
    ),
    # --- death by signal, as printed by faulthandler, the shell, torchrun or MPI ---
    _rule("segfault", r"Segmentation fault|\bSIGSEGV\b|\b[Ss]ignal:? 11\b", _K.SEGFAULT, _X, _C, signal=11),
    _rule("bus_error", r"\bBus error\b|\bSIGBUS\b|\b[Ss]ignal:? 7\b", _K.SEGFAULT, _X, _C, signal=7),
    _rule("abort", r"Fatal Python error: Aborted|\bSIGABRT\b|\b[Ss]ignal:? 6\b", _K.FATAL_SIGNAL, _X, _C, signal=6),
    # Host OOM may be the job's own growth or a neighbour's: no class until attribution weighs it.
    _rule(
        "oom_kill",
        r"\boom[-_ ]kill|Out of memory: Killed process|OOM Killed|Out Of Memory",
        _K.KILLED,
        _X,
        _C,
        signal=9,
        flags=re.IGNORECASE,
    ),
    # torchrun's agent: the rank it names is a local rank, so none is taken; its summary error is context.
    _rule(
        "torchrun_failed",
        r"elastic\.multiprocessing\.api:failed \(exitcode: (?P<exit_code>-?\d+)\)",
        _K.RANK_EXIT,
        _X,
        _C,
    ),
    _rule("torchrun_child_failed", r"\bChildFailedError\b", _K.RANK_EXIT, _X, _N),
    # --- the last line of a traceback: the program's own error ---
    _rule("python_exception", r"^" + _EXC + r"(?::\s*(?P<message>.*))?$", _K.PYTHON_EXCEPTION, _U, _C),
    # --- a trainer announcing its own exit (the demo: "fatal error (...): exiting with code 13") ---
    _rule(
        "exit_code",
        r"\bexit(?:ing|ed)? with (?:exit )?(?:code|status) (?P<exit_code>-?[1-9]\d*)",
        _K.RANK_EXIT,
        _X,
        _C,
        flags=re.IGNORECASE,
    ),
)

_LEADING_EXC = re.compile(r"^" + _EXC + r":\s*")
_NODE_IN_LINE = re.compile(r"^slurmstepd-(?P<a>[\w.\-]+):|(?<![\w.])node=(?P<b>[\w.\-]+)")
_SIGNALS = {
    "Segmentation fault": 11,
    "Bus error": 7,
    "Killed": 9,
    "Aborted": 6,
    "Floating point exception": 8,
    "Illegal instruction": 4,
    "Terminated": 15,
}


def classify(line: LogLine) -> list[CrashFinding]:
    """What ``line`` says crashed, by the first matching rule of ``CRASH_RULES``.

    Args:
        line: One log line, as ``LogTail`` returns it.

    Returns:
        No finding for an ordinary line; one per rank for a rule naming a task list; else one.
    """
    body = split_prefix(line.text, parse_time=False).body
    for rule in CRASH_RULES:
        m = rule.pattern.search(body)
        if m is not None:
            return _findings(rule, m, line, body)
    return []


def scan(lines: Iterable[LogLine]) -> list[CrashFinding]:
    """``classify`` every line, in order."""
    return [finding for line in lines for finding in classify(line)]


def to_evidence(finding: CrashFinding) -> Evidence:
    """The finding as domain ``Evidence``: the verbatim line with its rank, node and time."""
    return Evidence(
        source=EvidenceSource.LOGS, text=finding.text, node=finding.node or "", rank=finding.rank, at=finding.at
    )


def _findings(rule: CrashRule, m: re.Match[str], line: LogLine, body: str) -> list[CrashFinding]:
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    exception, message = g.get("exception"), g.get("message")
    leading = _LEADING_EXC.match(body)
    if exception is None and leading is not None:
        exception = leading.group("exception")
    if message is None and leading is not None:
        message = body[leading.end() :]
    elif message is None:
        # A bare "AssertionError" has no message; any other line is its own message.
        message = body[m.end("exception") :] if "exception" in g else body
    node = g.get("node")
    if node is None and rule.node_fallback:
        node = line.node or _node_in(body)
    exit_code = int(g["exit_code"]) if "exit_code" in g else None
    signal = _signal(g.get("signal")) or rule.signal
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code  # torchrun and Python's subprocess report death by signal N as -N
    base = CrashFinding(
        rule=rule.name,
        kind=rule.kind,
        failure_class=rule.failure_class,
        role=rule.role,
        culprit=rule.role is Role.CULPRIT,
        text=_clip(line.text.strip()),
        path=line.path,
        offset=line.offset,
        rank=int(g["rank"]) if "rank" in g else line.rank,
        node=node,
        exit_code=exit_code,
        signal=signal,
        exception=exception,
        message=_clip(message.strip()),
        xid=int(g["xid"]) if "xid" in g else None,
        at=line.at or _timestamp(g.get("at")),
    )
    if "ranks" not in g:
        return [base]
    ranks = _task_list(g["ranks"])
    if ranks is None:
        return [base.model_copy(update={"rank": None})]
    return [base.model_copy(update={"rank": rank}) for rank in ranks]


def _task_list(text: str) -> list[int] | None:
    """``0,2-3`` -> ``[0, 2, 3]``; None when it is malformed or implausibly long."""
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo or (hi == "" and part.endswith("-")):
            return None
        first, last = int(lo), int(hi or lo)
        if last < first or len(ranks) + last - first >= _MAX_TASKS:
            return None
        ranks.extend(range(first, last + 1))
    return ranks


def _node_in(body: str) -> str | None:
    m = _NODE_IN_LINE.search(body)
    return (m.group("a") or m.group("b")) if m else None


def _signal(text: str | None) -> int | None:
    if text is None:
        return None
    return int(text) if text.isdigit() else _SIGNALS.get(text)


def _timestamp(text: str | None) -> datetime | None:
    """Slurm's ``2026-11-30T03:47:28`` (taken as UTC: Slurm prints its host's local time, UTC on our clusters)."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
