"""Parsers of the node check's optional tools, each output -> one ``ProbeResult`` (pure; fixtures:
``tests/data/node_check``, real outputs from public posts).

* ``dcgmi diag -r 1``: the result table; any ``Fail`` row (or ``GPUn: Fail`` line) fails, ``Warn`` is noted.
* ``all_reduce_perf`` (nccl-tests): ``# Out of bounds values : N OK|FAILED``, the rows' ``#wrong`` columns and
  ``# Avg bus bandwidth``; a run without its summary line did not finish (it fails).
* ``ibstat``: every port's ``State``; a port not ``Active`` fails unless its link layer is Ethernet (a NIC's
  unused Ethernet port is common; an InfiniBand port down is the fault).
"""

from __future__ import annotations

import re

from workflows.domain.node_check import ProbeResult

__all__ = ["parse_dcgmi_diag", "parse_ibstat", "parse_nccl_all_reduce"]

_DCGMI_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<result>[^|]*?)\s*\|\s*$")
_GPU_RESULT = re.compile(r"^GPU(?P<gpu>\d+):\s*(?P<result>Pass|Fail|Warn|Skip)\b", re.IGNORECASE)


def parse_dcgmi_diag(text: str) -> ProbeResult:
    """``dcgmi diag`` as printed (table form)."""
    if "Successfully ran diagnostic" not in text and "| Diagnostic" not in text:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
        return ProbeResult(name="dcgmi-diag", ok=False, detail=f"did not run: {first[:200]}")
    failed: list[str] = []
    warned: list[str] = []
    rows = 0
    test = ""
    for line in text.splitlines():
        m = _DCGMI_ROW.match(line.strip())
        if m is None:
            continue
        name, result = m["name"], m["result"]
        if name:
            test = name
        gpu = _GPU_RESULT.match(result)
        verdict = (gpu["result"] if gpu else result.split(" ", 1)[0]).lower()
        where = f"{test} GPU{gpu['gpu']}" if gpu else test
        if verdict in ("pass", "fail", "warn", "skip"):
            rows += 1
        if verdict == "fail":
            failed.append(where)
        elif verdict == "warn":
            warned.append(where)
    if failed:
        return ProbeResult(name="dcgmi-diag", ok=False, detail=f"failed: {', '.join(failed)}")
    if rows == 0:
        return ProbeResult(name="dcgmi-diag", ok=False, detail="no test result in its output")
    note = f"; warnings: {', '.join(warned)}" if warned else ""
    return ProbeResult(name="dcgmi-diag", ok=True, detail=f"{rows} result(s) pass{note}")


_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s+(?P<verdict>OK|FAILED)")
_AVG_BW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<bw>[0-9.]+)")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s")


def parse_nccl_all_reduce(text: str, *, min_busbw_gbps: float = 0.0) -> ProbeResult:
    """``all_reduce_perf`` as printed; ``min_busbw_gbps`` > 0 also fails a slow run."""
    wrong = 0
    rows = 0
    for line in text.splitlines():
        if not _ROW.match(line):
            continue
        cols = line.split()
        rows += 1
        # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong (the in-place half)
        for idx in (8, 12):
            if idx < len(cols) and cols[idx].isdigit():
                wrong += int(cols[idx])
    oob = _OOB.search(text)
    bw = _AVG_BW.search(text)
    if oob is None or bw is None:
        return ProbeResult(name="nccl-all-reduce", ok=False, detail=f"no summary line: did not finish ({rows} rows)")
    busbw = float(bw["bw"])
    if oob["verdict"] != "OK" or wrong:
        return ProbeResult(
            name="nccl-all-reduce", ok=False, detail=f"wrong results: {oob['n']} out of bounds, #wrong {wrong}"
        )
    if min_busbw_gbps and busbw < min_busbw_gbps:
        return ProbeResult(
            name="nccl-all-reduce", ok=False, detail=f"bus bandwidth {busbw:g} GB/s below {min_busbw_gbps:g}"
        )
    return ProbeResult(name="nccl-all-reduce", ok=True, detail=f"avg bus bandwidth {busbw:g} GB/s, {rows} sizes")


_CA = re.compile(r"^CA '(?P<ca>[^']+)'")
_PORT = re.compile(r"^\s+Port (?P<port>\d+):")
_FIELD = re.compile(r"^\s+(?P<key>State|Physical state|Link layer|Rate):\s*(?P<value>.*?)\s*$")


def parse_ibstat(text: str) -> ProbeResult:
    """``ibstat`` as printed (every CA, every port)."""
    ports: dict[tuple[str, str], dict[str, str]] = {}
    ca = ""
    port = ""
    errors: list[str] = []
    for line in text.splitlines():
        if m := _CA.match(line):
            ca, port = m["ca"], ""
        elif m := _PORT.match(line):
            port = m["port"]
            ports[(ca, port)] = {}
        elif (m := _FIELD.match(line)) and port:
            ports[(ca, port)][m["key"]] = m["value"]
        elif line.startswith("ibpanic:"):
            errors.append(line.removeprefix("ibpanic:").strip())
    if not ports:
        return ProbeResult(
            name="ib-ports", ok=False, detail=f"no port listed: {'; '.join(errors) or 'no output'}"[:300]
        )
    bad = [
        f"{c} port {p} {f.get('State', '?')}/{f.get('Physical state', '?')}"
        for (c, p), f in ports.items()
        if f.get("State") != "Active" and f.get("Link layer") != "Ethernet"
    ]
    if bad or errors:
        return ProbeResult(name="ib-ports", ok=False, detail="; ".join([*bad, *errors])[:300])
    return ProbeResult(name="ib-ports", ok=True, detail=f"{len(ports)} port(s) active")
