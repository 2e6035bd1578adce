"""The docs name modules by path; after a move they must still point at something (ADRs are history: exempt)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PATH = re.compile(r"`((?:workflows|activities|workers|deploy|tests|docs)/[A-Za-z0-9_./-]+)`")
CURRENT_DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "adr" not in p.parts) + [ROOT / "README.md"]


@pytest.mark.parametrize("doc", CURRENT_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    named = {m.group(1).rstrip("/.") for m in PATH.finditer(doc.read_text())}
    missing = sorted(p for p in named if "*" not in p and "<" not in p and not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_check_sees_a_missing_path(tmp_path: Path) -> None:
    text = "see `activities/no_such_module.py` and `workflows/constants.py`"
    named = {m.group(1) for m in PATH.finditer(text)}
    assert {p for p in named if not (ROOT / p).exists()} == {"activities/no_such_module.py"}
