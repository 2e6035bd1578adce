"""A small, strict parser for the Prometheus text exposition format (version 0.0.4), as dcgm-exporter serves it.

Why our own: ``prometheus_client``'s parser renames counter samples (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` becomes
``..._TOTAL_total``) and is a heavy dependency for one page; this one returns the names as written.

What it accepts (https://prometheus.io/docs/instrumenting/exposition_formats/):

- ``# HELP name text`` (``\\\\`` and ``\\n`` escapes) and ``# TYPE name counter|gauge|histogram|summary|untyped``;
  other ``#`` lines are comments. A second, different TYPE for a name is an error.
- ``name{label="value",...} value [timestamp]``: label values with ``\\\\``, ``\\"`` and ``\\n`` escapes, blanks
  around labels and a trailing comma tolerated (dcgm-exporter's README shows ``{gpu="0", UUID="..."}``).
- Values as Go's ``ParseFloat`` reads them: integers (kept exact as ``int``: DCGM's "blank" sentinels sit just
  below 2**63), decimals, exponents, ``NaN``, ``+Inf``, ``-Inf``.

Like Prometheus itself, one bad line fails the whole page: a half-read page would make GPUs look missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ExpositionError", "ExpositionPage", "PromSample", "parse_exposition"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_SNIPPET = 80


class ExpositionError(ValueError):
    """The text is not a valid exposition page; the message names the line and what is wrong with it."""

    def __init__(self, lineno: int, problem: str, line: str) -> None:
        shown = line if len(line) <= _SNIPPET else line[:_SNIPPET] + "..."
        super().__init__(f"line {lineno}: {problem}: {shown!r}")
        self.lineno = lineno
        self.problem = problem


@dataclass(frozen=True, slots=True)
class PromSample:
    """One sample line. ``value`` is an ``int`` when the text was an integer, else a ``float``."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ExpositionPage:
    """A parsed page: samples in page order, and the TYPE and HELP lines by metric name."""

    samples: tuple[PromSample, ...]
    types: Mapping[str, str] = field(default_factory=dict)
    helps: Mapping[str, str] = field(default_factory=dict)


def parse_exposition(text: str) -> ExpositionPage:
    """Parse a whole page.

    Raises:
        ExpositionError: On the first malformed line (1-based line number in the message).
    """
    samples: list[PromSample] = []
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        stripped = line.strip(" \t")
        if not stripped:
            continue
        if stripped.startswith("#"):
            _comment(stripped, lineno, line, types, helps)
            continue
        samples.append(_sample(line, lineno))
    return ExpositionPage(samples=tuple(samples), types=types, helps=helps)


def _comment(stripped: str, lineno: int, line: str, types: dict[str, str], helps: dict[str, str]) -> None:
    parts = stripped[1:].lstrip(" \t").split(None, 2)
    if not parts or parts[0] not in ("HELP", "TYPE"):
        return  # a plain comment
    if len(parts) < 2 or not _METRIC_NAME.fullmatch(parts[1]):
        raise ExpositionError(lineno, f"{parts[0]} without a valid metric name", line)
    name = parts[1]
    rest = parts[2] if len(parts) > 2 else ""
    if parts[0] == "HELP":
        helps[name] = _unescape_help(rest)
        return
    kind = rest.strip()
    if kind not in _TYPES:
        raise ExpositionError(lineno, f"unknown metric type {_clip(kind)!r}", line)
    if types.get(name, kind) != kind:
        raise ExpositionError(lineno, f"second TYPE for {name} ({types[name]} before)", line)
    types[name] = kind


def _unescape_help(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in ("\\", "n"):
            out.append("\n" if text[i + 1] == "n" else "\\")
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _sample(line: str, lineno: int) -> PromSample:
    pos = len(line) - len(line.lstrip(" \t"))
    match = _METRIC_NAME.match(line, pos)
    if match is None:
        raise ExpositionError(lineno, "expected a metric name", line)
    name = match.group()
    pos = match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos = _labels(line, pos + 1, lineno, labels)
    tokens = line[pos:].split()
    if pos < len(line) and line[pos] not in " \t":
        raise ExpositionError(lineno, "expected a blank after the metric name or labels", line)
    if not tokens or len(tokens) > 2:
        raise ExpositionError(lineno, "expected a value and an optional timestamp", line)
    value = _value(tokens[0], lineno, line)
    timestamp = None
    if len(tokens) == 2:
        if not _INT.fullmatch(tokens[1]):
            raise ExpositionError(lineno, f"timestamp {_clip(tokens[1])!r} is not an integer", line)
        timestamp = int(tokens[1])
    return PromSample(name=name, labels=labels, value=value, timestamp_ms=timestamp)


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _labels(line: str, pos: int, lineno: int, labels: dict[str, str]) -> int:
    """Parse ``name="value",...}`` from ``pos`` (just after the brace); returns the position after ``}``."""
    while True:
        pos = _skip_blanks(line, pos)
        if pos < len(line) and line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            raise ExpositionError(lineno, "expected a label name or '}'", line)
        label = match.group()
        pos = _skip_blanks(line, match.end())
        if pos >= len(line) or line[pos] != "=":
            raise ExpositionError(lineno, f"expected '=' after label {label}", line)
        pos = _skip_blanks(line, pos + 1)
        if pos >= len(line) or line[pos] != '"':
            raise ExpositionError(lineno, f"expected '\"' to open the value of label {label}", line)
        value, pos = _label_value(line, pos + 1, lineno, label)
        if label in labels:
            raise ExpositionError(lineno, f"label {label} given twice", line)
        labels[label] = value
        pos = _skip_blanks(line, pos)
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos >= len(line) or line[pos] != "}":
            raise ExpositionError(lineno, f"expected ',' or '}}' after label {label}", line)


def _label_value(line: str, pos: int, lineno: int, label: str) -> tuple[str, int]:
    out: list[str] = []
    while pos < len(line):
        ch = line[pos]
        if ch == '"':
            return "".join(out), pos + 1
        if ch == "\\":
            nxt = line[pos + 1] if pos + 1 < len(line) else ""
            if nxt not in _ESCAPES:
                raise ExpositionError(lineno, f"invalid escape '\\{nxt}' in label {label}", line)
            out.append(_ESCAPES[nxt])
            pos += 2
            continue
        out.append(ch)
        pos += 1
    raise ExpositionError(lineno, f"unterminated value of label {label}", line)


def _value(token: str, lineno: int, line: str) -> float:
    special = _SPECIAL.get(token.lower())
    if special is not None:
        return special
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token)
    raise ExpositionError(lineno, f"value {_clip(token)!r} is not a number", line)


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
