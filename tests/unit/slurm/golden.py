"""Golden captures from a real Slurm 22.05.8 cluster (tests/data/slurm/README.md says how they were made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "slurm"


def read(name: str) -> bytes:
    """The raw bytes of one capture."""
    return (DATA_DIR / name).read_bytes()


def load(name: str) -> dict[str, Any]:
    """One JSON capture, decoded."""
    data: dict[str, Any] = json.loads(read(name))
    return data


def scontrol_errors() -> dict[str, dict[str, Any]]:
    """Real scontrol outcomes by case name: ``argv``, ``rc``, ``stdout``, ``stderr``."""
    cases: list[dict[str, Any]] = json.loads(read("scontrol_errors.json"))
    return {case["case"]: case for case in cases}


def squeue_with(**jobs: dict[str, Any]) -> bytes:
    """``squeue.json`` with job fields overridden, keyed ``job_<id>`` (e.g. ``job_1={"job_state": "PENDING"}``)."""
    payload = load("squeue.json")
    for key, changes in jobs.items():
        job_id = int(key.removeprefix("job_"))
        job = next(j for j in payload["jobs"] if j["job_id"] == job_id)
        job.update(changes)
    return json.dumps(payload).encode()


def sinfo_with(**nodes: dict[str, Any]) -> bytes:
    """``sinfo.json`` with node fields overridden, keyed by node name (e.g. ``n1={"state_flags": ["DRAIN"]}``)."""
    payload = load("sinfo.json")
    for name, changes in nodes.items():
        node = next(n for n in payload["nodes"] if n["name"] == name)
        node.update(changes)
    return json.dumps(payload).encode()
