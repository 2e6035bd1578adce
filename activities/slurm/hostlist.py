"""Slurm hostlists: ``n[1-3,5]`` <-> ``("n1", "n2", "n3", "n5")``. Pure functions, no Slurm needed.

Slurm writes node sets as hostlist expressions everywhere (``nodes``, ``excluded_nodes``, ``required_nodes``);
``squeue --json`` keeps whatever the user typed (``n[1-2],n4,n3`` stays as is), so every consumer must expand.

Grammar (what Slurm 22.05 accepts and prints):

* a comma-separated list of host expressions; commas inside brackets belong to the bracket;
* a bracket holds comma-separated numbers or ``lo-hi`` ranges; the width of ``lo`` sets zero padding
  (``n[08-10]`` -> ``n08 n09 n10``, ``n[8-10]`` -> ``n8 n9 n10``);
* several brackets in one expression expand as a cartesian product (``r[1-2]-n[1-2]`` -> ``r1-n1 r1-n2 ...``),
  and text may follow a bracket (``a[1-2]b``).

``compress`` ranges over the last run of digits in each name, which is how Slurm names nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["HostlistError", "MAX_HOSTS", "compress", "expand"]

#: Refuse expressions that expand beyond this: a typo like ``n[1-100000000]`` must not exhaust memory.
MAX_HOSTS = 100_000

_LAST_DIGITS = re.compile(r"^(.*?)(\d+)(\D*)$")


class HostlistError(ValueError):
    """The text is not a valid Slurm hostlist."""


def expand(hostlist: str) -> tuple[str, ...]:
    """Expand a hostlist into node names, in the order written, without duplicates.

    Args:
        hostlist: A Slurm hostlist such as ``gpu-a[01-03],cpu1``. Empty or blank means no nodes.

    Returns:
        The node names; ``()`` for an empty hostlist.

    Raises:
        HostlistError: Unbalanced or nested brackets, an empty element, a range whose end is below its start,
            a non-numeric range, or more than ``MAX_HOSTS`` names.
    """
    names: dict[str, None] = {}  # an ordered set
    for expression in _split_top_level(hostlist.strip()):
        for name in _expand_expression(expression):
            names[name] = None
            if len(names) > MAX_HOSTS:
                raise HostlistError(f"hostlist {hostlist[:80]!r} expands to more than {MAX_HOSTS} names")
    return tuple(names)


def compress(names: Iterable[str]) -> str:
    """Compress node names into a canonical, sorted hostlist (``n1,n2,n3,n5`` -> ``n[1-3,5]``).

    Names are grouped by the text around their last run of digits; zero-padded numbers only join ranges of
    the same width, so ``expand(compress(x))`` gives back exactly the set ``x``.

    Args:
        names: Node names (duplicates are ignored). Each must be non-empty and free of ``[],`` and spaces.

    Returns:
        The hostlist; ``""`` when there are no names.

    Raises:
        HostlistError: A name is empty or contains characters that cannot appear in a hostlist.
    """
    plain: set[str] = set()
    groups: dict[tuple[str, str], set[str]] = {}
    for name in set(names):
        if not name or any(c in name for c in "[], \t\n"):
            raise HostlistError(f"not a node name: {name!r}")
        match = _LAST_DIGITS.match(name)
        if match is None:
            plain.add(name)
        else:
            prefix, digits, suffix = match.groups()
            groups.setdefault((prefix, suffix), set()).add(digits)
    parts = [(name, name) for name in plain]
    for (prefix, suffix), numbers in groups.items():
        runs = _runs(numbers)
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            text = f"{prefix}{runs[0][0]}{suffix}"
        else:
            body = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
            text = f"{prefix}[{body}]{suffix}"
        parts.append((f"{prefix}{suffix}", text))
    return ",".join(text for _, text in sorted(parts))


def _runs(numbers: set[str]) -> list[tuple[str, str]]:
    """Consecutive runs of digit strings, each run of one width so that ``lo-hi`` expands back exactly."""
    runs: list[list[str]] = []
    # Sorting by (value, width) lets each number extend a run that ends just below it at the same width.
    for digits in sorted(numbers, key=lambda d: (int(d), len(d))):
        value = int(digits)
        for run in runs:
            lo, hi = run
            if int(hi) + 1 == value and str(value).zfill(len(lo)) == digits:
                run[1] = digits
                break
        else:
            runs.append([digits, digits])
    return sorted(((lo, hi) for lo, hi in runs), key=lambda r: (int(r[0]), len(r[0])))


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets."""
    if not text:
        return []
    parts: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in hostlist {text[:80]!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {text[:80]!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {text[:80]!r}")
    parts.append(text[start:])
    for part in parts:
        if not part.strip():
            raise HostlistError(f"empty element in hostlist {text[:80]!r}")
    return [part.strip() for part in parts]


def _expand_expression(expression: str) -> list[str]:
    """Expand one comma-free (outside brackets) expression, e.g. ``r[1-2]-n[01-02]``."""
    results = [""]
    rest = expression
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            results = [r + rest for r in results]
            break
        close_at = rest.index("]", open_at)  # balanced: checked by _split_top_level
        literal, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
        numbers = _expand_bracket(body, expression)
        if len(results) * len(numbers) > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression[:80]!r} expands to more than {MAX_HOSTS} names")
        results = [r + literal + n for r in results for n in numbers]
    return results


def _expand_bracket(body: str, expression: str) -> list[str]:
    numbers: list[str] = []
    for item in body.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist {expression[:80]!r}")
        if not sep:
            numbers.append(lo)
            continue
        start, end = int(lo), int(hi)
        if end < start:
            raise HostlistError(f"range {item!r} ends before it starts in {expression[:80]!r}")
        if end - start >= MAX_HOSTS:
            raise HostlistError(f"range {item!r} in {expression[:80]!r} exceeds {MAX_HOSTS} names")
        numbers.extend(str(value).zfill(len(lo)) for value in range(start, end + 1))
    return numbers
