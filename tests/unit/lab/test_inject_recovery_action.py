"""``rebound lab inject recovery-action``: the fake NVML of a lab node reports the recovery action asked for."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deploy.local.cli import _inject_recovery_action
from deploy.local.fake_nvml_state import write_initial_state


def _lab(tmp_path: Path) -> Any:
    state = tmp_path / "n2.state"
    write_initial_state(state, "n2", 4)
    return SimpleNamespace(cfg=SimpleNamespace(layout=SimpleNamespace(nvml_state=lambda node: state))), state


@pytest.mark.parametrize(
    ("action", "code", "name"),
    [("node_reboot", 2, "node_reboot"), ("none", 0, "none"), ("4", 4, "drain_and_reset"), ("9", 9, "unknown")],
)
def test_the_action_lands_in_the_nodes_fake_nvml_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, code: int, name: str
) -> None:
    lab, state = _lab(tmp_path)
    args = argparse.Namespace(node="n2", gpu=1, action=action)
    assert _inject_recovery_action(lab, args) == 0
    assert state.read_text().splitlines()[-1] == f"gpu 1 recovery_action {code}"
    record = json.loads(capsys.readouterr().out)
    assert (record["node"], record["gpu"], record["code"], record["action"]) == ("n2", 1, code, name)


def test_a_name_pynvml_does_not_define_is_refused(tmp_path: Path) -> None:
    lab, _ = _lab(tmp_path)
    with pytest.raises(SystemExit, match="one of none, gpu_reset, node_reboot"):
        _inject_recovery_action(lab, argparse.Namespace(node="n2", gpu=None, action="reboot_please"))
