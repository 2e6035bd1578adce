"""The failure-signature library: compiles ``activities.logs.signature_table`` and says which row a line matches.

``SIGNATURES`` (the table, highest priority first) is the only place where log text is interpreted;
``activities.logs.crash`` reads every line through it, for the live watch, the attribution activity and ``rebound
diagnose`` alike. ``prepare`` strips terminal colour codes (``activities.logs.terminal``), then peels off what
launchers put in front of a line: srun labels (``0: ``), ``[rank3]:``/``[default3]:``, timestamps, OpenMPI's
``[1,3]<stderr>:``, Ray's ``(pid=1, ip=...)``, pdsh's ``host: ``, NCCL's ``host:pid:tid [gpu] NCCL WARN``, syslog's
``date host kernel:``. ``match`` finds the highest-priority row whose pattern is in the body (a row's ``hints`` skip
its regex on most lines); lines that are only chatter (``NCCL INFO``, missing optional NCCL plugins) never match.
What a matched line implicates is ``activities.logs.signature_fields.extract``'s.

The XID catalogue (``xid_catalog.tsv`` beside this module: NVIDIA's catalogue with NVSentinel's actions and a
recommended action per XID) is read on first use through ``activities.gpu.xid_catalog``, its one loader: an XID
the catalogue calls informational (43, 63, ...) is context, 79 is ``gpu_fell_off_bus``, any other is ``xid``. An
NVRM line's own words outrank the catalogue (``workflows.policy.xid_line``): an XID the driver labels ``Nonfatal``
(NVLink5, 144-150) and XID 154 back to a recovery action of None are context too.
An exit status that names SIGSEGV or SIGBUS (a row's ``by_signal``) is filed under that signal's category.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from activities.logs.line import LinePrefix, split_prefix
from activities.logs.signature_fields import signal_number
from activities.logs.signature_table import ROWS
from activities.logs.signature_types import CATEGORIES, Category, Prepared, Role, Signature, SignatureMatch
from activities.logs.terminal import strip_terminal_codes
from workflows.domain.gpu import GpuRecoveryAction
from workflows.domain.incident import FailureClass
from workflows.policy.xid_line import xid_line_facts

__all__ = ["BENIGN", "BENIGN_NEEDS", "SIGNATURES", "benign", "lines_may_match", "match", "peel", "prepare"]

SIGNATURES: tuple[Signature, ...] = tuple(sorted(ROWS, key=lambda s: -s.priority))
"""The table, highest priority first (rows of equal priority in the order written)."""

# Chatter that mentions errors without being one: NCCL's INFO trace, optional plugins that are absent, and the
# mlx5 driver's notices: a transceiver module's state at info level ("Port module event: module 0, Cable
# unplugged"; a module fault is printed as "Port module event[error]: ..."), a netdev's "Link down"/"Link up" as a
# port comes up (a link lost under a job shows in its NCCL/UCX completion errors), and the write-combining probe at
# device init, whose failure only turns an optimisation off.
BENIGN = re.compile(
    r"\bNCCL INFO\b|Failed to open libibverbs|NET/Plugin\b|No plugin found|Could not find: libnccl-net"
    r"|Could not find real path"
    r"|\bmlx5_core \S+: (?:\S+: )?Port module event: module \d+, |\bmlx5_core \S+ [\w.\-]+: Link (?:up|down)\s*$"
    r"|\bmlx5_ib_test_wc\b.*while trying to test write-combining support"
)
#: Texts one of which every ``BENIGN`` match contains, as written (proved from the regex in
#: ``tests/unit/logs/test_benign_needs.py``): a line with none of them skips the regex, which tries its alternatives
#: at every position (~6 us a line, the most expensive test of a training step line that names its ``loss``).
BENIGN_NEEDS = ("NCCL INFO", "Failed to open libibverbs", "NET/Plugin", "No plugin found", "Could not find", "mlx5_")
_SIGNAL_CATEGORY = {11: Category.SEGFAULT, 7: Category.BUS_ERROR}

# ----- prefixes -------------------------------------------------------------------------------------------------

# OpenMPI's --tag-output, Ray's worker prefix, pdsh/mpirun's "host: " (a name with a digit, so "RuntimeError: "
# is never taken for one).
_EXTRA_PREFIX = re.compile(
    r"[:|]\s+"  # what is left of "2024-05-01T10:00:00Z: " or "... | " once the timestamp is gone
    r"|(?:[A-Z][a-z]{2} ){1,2} ?\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d{4})? +"  # syslog, ctime: "Jul 13 21:22:34 "
    r"|\[(?:\s*\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4})\]\s*"  # dmesg, dmesg -T
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?"
    r"|\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s+"
    r"|\[(?P<ucx>[\w.\-]+):\d+\s*:\d+:\d+\]\s*"  # UCX/MPI: "[host:pid :thread:tid] Caught signal 11"
    # A host name with a digit before its first dot; possessive, so a long run of name characters not followed by
    # ": " fails in linear time (the plain form backtracked quadratically).
    r"|(?P<host>(?!rank\d)[A-Za-z](?=[A-Za-z0-9\-]*\d)[A-Za-z0-9.\-]*+|\d{1,3}(?:\.\d{1,3}){3}): (?=\S)"
)
_NCCL_PREFIX = re.compile(r"^(?P<host>[\w.\-]+):\d+:\d+ \[(?P<gpu>\d+)\]")


def prepare(text: str) -> Prepared:
    """Peel launcher, rank and time prefixes off ``text``; keep the rank, host and GPU they name.

    Args:
        text: One log line as written (terminal colour codes are stripped first: ``activities.logs.terminal``).

    Returns:
        The body the rows are matched against, and the rank (srun label, ``[rankN]:``, OpenMPI tag), host (pdsh
        prefix, ``slurmstepd-<node>:``, NCCL's ``host:pid:tid``) and GPU (NCCL's ``[dev]``) its prefixes name,
        each None when they name none. What the body names itself is read by ``extract``, for matched lines only.
    """
    return peel(split_prefix(strip_terminal_codes(text), parse_time=False))


def peel(prefix: LinePrefix) -> Prepared:
    """``prepare`` of a line whose first prefixes are already peeled: ``prefix`` is its ``split_prefix`` (terminal
    codes stripped, ``parse_time=False``; ``activities.logs.line.Line.prefix``)."""
    body = prefix.body
    # ``[rankN]:`` is the global rank; an srun label is only the Slurm task (``activities.logs.line``).
    rank = prefix.torch_rank if prefix.torch_rank is not None else prefix.label
    host: str | None = None
    gpu: str | None = None
    for _ in range(6):  # prefixes nest: "2024-...Z: [1,12]<stdout>:host:pid:tid [0] NCCL WARN ...", two timestamps
        again = split_prefix(body, parse_time=False)
        if again.body != body:
            body = again.body
            if rank is None:
                rank = again.torch_rank if again.torch_rank is not None else again.label
            continue
        m = _EXTRA_PREFIX.match(body)
        if m is None:
            break
        if m.group("mpi") is not None and rank is None:
            rank = int(m.group("mpi"))
        if m.group("host") is not None or m.group("ucx") is not None:
            host = (m.group("host") or m.group("ucx")).removeprefix("slurmstepd-")
        body = body[m.end() :]
    m = _NCCL_PREFIX.match(body)
    if m is not None:
        host, gpu = m.group("host"), m.group("gpu")
    return Prepared(body, rank, host, gpu)


# ----- matching -------------------------------------------------------------------------------------------------


def match(body: str) -> SignatureMatch | None:
    """The highest-priority row whose pattern is found in ``body`` (see ``prepare``), or None."""
    low = body.lower()
    hits = [_ROWS_OF_HINT[h] for h in _hints_in(low)]
    if not hits and not _ALWAYS_TRIED:
        return None  # most lines: no row could match
    candidates = [i for i in sorted(set(_ALWAYS_TRIED).union(*hits)) if (g := _GUARD_OF[i]) is None or g(low)]
    if not candidates or benign(body):
        return None  # no row can match (benign or not, no match), or harmless chatter
    for i in candidates:
        sig = SIGNATURES[i]
        m = sig.pattern.search(body)
        if m is not None:
            return _resolve(sig, {k: v for k, v in m.groupdict().items() if v is not None}, body)
    return None


def lines_may_match(text: str) -> bool:
    """Whether any line of ``text`` (whole log lines, as written, joined by their line ends) could match a row.

    False only when ``match`` finds nothing in the body of any of its lines, whatever their prefixes: the watch's
    quiet polls skip a chunk of pure progress on this word (``activities.logs.peek``). A body is a slice of its line
    once terminal codes are stripped, and a line of printable ASCII without ESC has none, so a hint in a body's
    lower case is in the chunk's lower case; a row is tried only when one of its hints is there (no row is tried
    always), and the one guarded hint (``loss``) is followed by its guard's test on each line that holds it (the
    guard is true of a line whenever it is true of a slice of it). Anything else (non-ASCII, ESC) may match."""
    if _ALWAYS_TRIED or not text.isascii() or "\x1b" in text:
        return True
    low = text.lower()
    for hint in _hints_in(low):
        guards = _GUARDS_OF_HINT[hint]
        if guards is None:
            return True
        if any(any(guard(line) for guard in guards) for line in _lines_holding(low, hint)):
            return True
    return False


def _lines_holding(low: str, hint: str) -> list[str]:
    """Every line of ``low`` (ends: ``\n``, ``\r``) that holds ``hint``."""
    return [line for line in low.replace("\r", "\n").split("\n") if hint in line]


def benign(body: str) -> bool:
    """Whether ``body`` is known harmless chatter (``BENIGN``), tested by its texts first (``BENIGN_NEEDS``)."""
    return any(text in body for text in BENIGN_NEEDS) and BENIGN.search(body) is not None


def _hints_in(low: str) -> set[str]:
    """The hints that occur in ``low`` (a lower-cased body): at each position where one starts, the trie takes the
    longest, and every hint that is a prefix of it starts there too (the search resumes one character on, so
    overlapping hints are found)."""
    found: set[str] = set()
    search = _HINT_AT.search
    m = search(low)
    while m is not None:
        found.update(_PREFIX_HINTS[m.group()])
        m = search(low, m.start() + 1)
    return found


def _index_hints() -> tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[int, ...]]:
    rows: dict[str, list[int]] = {}
    for i, sig in enumerate(SIGNATURES):
        for hint in sig.hints:
            rows.setdefault(hint, []).append(i)
    return tuple((h, tuple(v)) for h, v in rows.items()), tuple(i for i, sig in enumerate(SIGNATURES) if not sig.hints)


def _hint_trie(hints: Sequence[str]) -> str:
    """A regex matching, at a position, the longest of ``hints`` that starts there: a trie whose every branch tries
    its longer continuations before ending (all hints that start at one position are prefixes of each other, so
    they lie on one branch)."""
    trie: dict[str, Any] = {}
    for hint in hints:
        node = trie
        for ch in hint:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        if len(alts) == 1 and "" not in node:
            return alts[0]
        return "(?:" + "|".join(alts) + ")" + ("?" if "" in node else "")

    return emit(trie)


def _prefix_hints(hints: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """For each hint, every hint that is a prefix of it (itself included)."""
    return {h: tuple(p for p in hints if h.startswith(p)) for h in hints}


# The hints present in a line are found in one pass of a trie regex (a third less than ~185 substring tests, and a
# plain search from each found position half a lookahead at every position, measured): at each position the trie
# takes the longest hint that starts there, and every hint that is a prefix of it starts there too; so the hints
# found are exactly those a substring test of each finds (``tests/unit/logs/test_signatures.py``). Only the rows
# whose hints are present run their regex.
_HINTS_OF_ROWS, _ALWAYS_TRIED = _index_hints()
_ROWS_OF_HINT = dict(_HINTS_OF_ROWS)
_PREFIX_HINTS = _prefix_hints(list(_ROWS_OF_HINT))
_HINT_AT = re.compile(_hint_trie(list(_ROWS_OF_HINT)), re.DOTALL)


def _loss_then_not_finite(low: str) -> bool:
    """Whether ``nan`` or ``inf`` follows the first ``loss`` in ``low`` (a lower-cased body): every match of the
    ``loss_not_finite`` row holds a loss word and, after it, a NaN or Inf (``regex_proof.proved_in_order``); a
    training step line names its finite loss and runs no regex (``[INFO]`` before the loss is no Inf).

    Lower-casing maps each ASCII character to one ASCII character, so a match's ASCII text stays contiguous and in
    order in ``low``, and the first ``loss`` in ``low`` is at or before the match's."""
    at = low.find("loss")
    return at >= 0 and (low.find("nan", at + 4) >= 0 or low.find("inf", at + 4) >= 0)


# A row's guard: a cheaper test of the lower-cased body than its regex, true of every line the regex matches, tried
# once a hint made the row a candidate (the hint ``loss`` is in every step line that prints one).
_GUARDS: dict[str, Callable[[str], bool]] = {"loss_not_finite": _loss_then_not_finite}
_GUARD_OF: tuple[Callable[[str], bool] | None, ...] = tuple(_GUARDS.get(sig.id) for sig in SIGNATURES)


def _guards_of_hints() -> dict[str, tuple[Callable[[str], bool], ...] | None]:
    """For each hint, its rows' guards; None when one of its rows has none (the hint alone makes it a candidate)."""
    out: dict[str, tuple[Callable[[str], bool], ...] | None] = {}
    for hint, rows in _ROWS_OF_HINT.items():
        guards = [_GUARD_OF[i] for i in rows]
        out[hint] = None if any(g is None for g in guards) else tuple(g for g in guards if g is not None)
    return out


_GUARDS_OF_HINT = _guards_of_hints()


def _resolve(sig: Signature, groups: dict[str, str], body: str) -> SignatureMatch:
    category, role, detail = sig.category, sig.role, ""
    if sig.xid_catalog and "xid" in groups:
        # The catalogue is read on first use, by its one loader (the GPU health verdict reads it too).
        from activities.gpu.xid_catalog import default_xid_catalog

        xid = int(groups["xid"])
        entry = default_xid_catalog().get(xid)
        if entry is None:
            detail = f"XID {xid}: not in the catalogue"
        else:
            action = entry.recommended_action or entry.action
            detail = f"XID {xid} {entry.mnemonic}: {entry.meaning}; recommended: {action}"
            if action.startswith("None (informational)") or action == "IGNORE":
                category, role = Category.NONE, Role.INFO  # e.g. 43, 63: context, not a failure of its own
            elif (said := _driver_says_no_action(body, xid)) is not None:
                detail = f"{detail}; {said}"
                category, role = Category.NONE, Role.INFO
            elif "FALLEN_OFF_THE_BUS" in entry.mnemonic:
                category = Category.GPU_FELL_OFF_BUS
            elif entry.action == "RESTART_APP":
                # NVIDIA's bucket for XIDs that need no node action (13, 31, ...): as often the application's
                # fault as the GPU's, so the class is not hardware.
                return SignatureMatch(sig, groups, category, role, FailureClass.UNKNOWN, True, detail)
    if sig.by_signal:
        signal = _signal_of(groups)
        category = _SIGNAL_CATEGORY.get(signal, category) if signal is not None else category
    if category is sig.category:
        return SignatureMatch(sig, groups, category, role, sig.failure_class, sig.restartable, detail)
    info_c = CATEGORIES[category]
    return SignatureMatch(sig, groups, category, role, info_c.failure_class, info_c.restartable, detail)


def _driver_says_no_action(body: str, xid: int) -> str | None:
    """Why the NVRM line itself makes this XID context (its Nonfatal label, XID 154 back to None), or None."""
    facts = xid_line_facts(body)
    if facts is None or facts.xid != xid:
        return None
    if facts.fatal is False:
        return "the driver labels it Nonfatal: no action"
    if facts.recovery_to is GpuRecoveryAction.NONE:
        return "the recovery action is back to None: nothing to do"
    return None


def _signal_of(groups: dict[str, str]) -> int | None:
    """The signal an exit status names: ``-11`` (Python, torchrun) or ``139`` (a shell: 128 + 11)."""
    if "signal" in groups:
        return signal_number(groups["signal"])
    if "exit_code" in groups:
        code = int(groups["exit_code"])
        if code < 0:
            return -code
        if 128 < code < 160:
            return code - 128
    return None
