"""A proof, from a regex's own parse tree, that every match contains one of some texts: what lets the log readers
test a cheap substring before running the regex (``activities.logs.step_line``'s ``needs``, the benign-chatter
regex's ``BENIGN_NEEDS``). A "no" may be a missed proof, a "yes" is never wrong."""

from __future__ import annotations

import re
import warnings
from typing import Any

__all__ = ["proved"]

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_constants as sre_c
    import sre_parse


def _char(op: Any, av: Any, fold: bool) -> str | None:
    """The one character an item matches (``fold``: any case, lower-cased), else None: ``a``, ``[Aa]``."""
    if op is sre_c.LITERAL:
        return chr(av).lower() if fold else chr(av)
    if fold and op is sre_c.IN and av and all(o is sre_c.LITERAL for o, _ in av):
        letters = {chr(a).lower() for _, a in av}
        return letters.pop() if len(letters) == 1 else None
    return None


def _covered(items: list[Any], needs: tuple[str, ...], fold: bool, run: str = "") -> bool:
    """Does every match of this parsed sequence contain one of ``needs``? (As in ``test_signatures``: a run of
    literal characters must appear; groups are inlined, branches each followed by the rest; anything else ends the
    run, which can only make the answer "no", never a wrong "yes".)"""
    for i, (op, av) in enumerate(items):
        ch = _char(op, av, fold)
        if ch is not None:
            run += ch
            if any(n in run for n in needs):
                return True
            continue
        rest = items[i + 1 :]
        if op is sre_c.BRANCH:
            return all(_covered(list(b.data) + rest, needs, fold, run) for b in av[1])
        if op is sre_c.SUBPATTERN:
            return _covered(list(av[-1].data) + rest, needs, fold, run)
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[0] >= 1 and _covered(list(av[2].data), needs, fold):
            return True
        run = ""
    return False


def proved(pattern: re.Pattern[str], needs: tuple[str, ...], *, fold: bool | None = None) -> bool:
    """Whether every match of ``pattern`` contains one of ``needs``, compared in lower case where ``fold`` (by
    default: for an IGNORECASE pattern; the signature hints are searched in the lower-cased line whatever the
    row's flags, so they pass ``fold=True``)."""
    fold = bool(pattern.flags & re.IGNORECASE) if fold is None else fold
    assert needs and all(n and (n == n.lower() or not fold) for n in needs)
    return _covered(list(sre_parse.parse(pattern.pattern, pattern.flags).data), needs, fold)


def _starts(items: list[Any], needs: tuple[str, ...], fold: bool, run: str = "") -> bool:
    """Does every match of this parsed sequence begin with one of ``needs``? Zero-width tests (``\\b``, ``^``,
    lookarounds) consume nothing and are skipped; literal characters extend ``run`` from the match's start; branches
    are each followed by the rest and groups inlined; anything else before a need is complete answers "no"."""
    for i, (op, av) in enumerate(items):
        if op in (sre_c.AT, sre_c.ASSERT, sre_c.ASSERT_NOT):
            continue
        ch = _char(op, av, fold)
        if ch is not None:
            run += ch
            if any(run.startswith(n) for n in needs):
                return True
            if not any(n.startswith(run) for n in needs):
                return False
            continue
        rest = items[i + 1 :]
        if op is sre_c.BRANCH:
            return all(_starts(list(b.data) + rest, needs, fold, run) for b in av[1])
        if op is sre_c.SUBPATTERN:
            return _starts(list(av[-1].data) + rest, needs, fold, run)
        return False
    return False


def proved_start(pattern: re.Pattern[str], needs: tuple[str, ...], *, fold: bool | None = None) -> bool:
    """Whether every match of ``pattern`` begins with one of ``needs`` (after zero-width tests only), compared in
    lower case where ``fold`` (by default: for an IGNORECASE pattern). Then no match begins before the first
    occurrence of any of them, and a search may start there."""
    fold = bool(pattern.flags & re.IGNORECASE) if fold is None else fold
    assert needs and all(n and (n == n.lower() or not fold) for n in needs)
    return _starts(list(sre_parse.parse(pattern.pattern, pattern.flags).data), needs, fold)


def _in_order(items: list[Any], seq: tuple[tuple[str, ...], ...], fold: bool, run: str = "") -> bool:
    """Does every match of this parsed sequence contain one of ``seq[0]``, then after it one of ``seq[1]``, ...?
    As ``_covered``: a need must lie in a run of literal characters; once one is found, the rest of the run after
    its earliest end is searched for the next."""
    for i, (op, av) in enumerate(items):
        ch = _char(op, av, fold)
        if ch is not None:
            run += ch
            ends = [run.find(n) + len(n) for n in seq[0] if n in run]
            while ends:
                if len(seq) == 1:
                    return True
                seq, run = seq[1:], run[min(ends) :]
                ends = [run.find(n) + len(n) for n in seq[0] if n in run]
            continue
        rest = items[i + 1 :]
        if op is sre_c.BRANCH:
            return all(_in_order(list(b.data) + rest, seq, fold, run) for b in av[1])
        if op is sre_c.SUBPATTERN:
            return _in_order(list(av[-1].data) + rest, seq, fold, run)
        run = ""
    return False


def proved_in_order(pattern: re.Pattern[str], seq: tuple[tuple[str, ...], ...], *, fold: bool = True) -> bool:
    """Whether every match of ``pattern`` contains one of ``seq[0]``, and after its end one of ``seq[1]``, and so on
    (compared in lower case where ``fold``)."""
    assert seq and all(n and (n == n.lower() or not fold) for needs in seq for n in needs)
    return _in_order(list(sre_parse.parse(pattern.pattern, pattern.flags).data), seq, fold)
