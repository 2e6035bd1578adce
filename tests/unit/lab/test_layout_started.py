"""``LabLayout.started``: what `down` stops is what an earlier `up` recorded, not what the configuration says now."""

from __future__ import annotations

from pathlib import Path

from deploy.local.layout import LabLayout


def test_started_lists_every_pid_file_of_the_prefix(tmp_path: Path) -> None:
    lay = LabLayout(tmp_path)
    lay.run.mkdir(parents=True)
    for service in ("agent-n1", "agent-n5", "slurmd-n5", "worker"):
        lay.pid_file(service).write_text("1\n")
    (lay.run / "agent-n2.sock").write_text("")
    assert lay.started("agent-") == ["agent-n1", "agent-n5"]
    assert lay.started("slurmd-") == ["slurmd-n5"]
    assert lay.started("temporal") == []
