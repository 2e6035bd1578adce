from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from deploy.local.config import LabConfig
from deploy.local.slurm_config import render_gres_conf, render_slurm_conf
from deploy.local.system import HOSTS_MARK, ensure_node_hosts


def _conf(tmp_path: Path, **kw: object) -> dict[str, str]:
    text = render_slurm_conf(LabConfig(state_dir=tmp_path, **kw))  # type: ignore[arg-type]
    out: dict[str, str] = {}
    for line in text.replace("\\\n", "").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, value)
    return out


def test_four_nodes_on_their_own_ports(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    assert conf["NodeName"].startswith("n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-17004]")
    assert "Gres=gpu:4" in conf["NodeName"]
    assert conf["SlurmctldPort"] == "6817"


def test_fast_failure_detection_and_requeue(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    assert int(conf["SlurmdTimeout"]) <= 5
    assert "cred_expire=5" in conf["AuthInfo"]
    assert conf["ReturnToService"] == "2"


def test_every_path_is_absolute_under_the_state_dir(tmp_path: Path) -> None:
    text = render_slurm_conf(LabConfig(state_dir=tmp_path))
    for token in text.replace("=", " ").replace(",", " ").split():
        if token.startswith("/") and not token.startswith("/bin/"):
            assert token.startswith(str(tmp_path)), token


def test_relative_state_dir_becomes_absolute() -> None:
    cfg = LabConfig(state_dir=Path("some/dir"))
    assert cfg.state_dir.is_absolute()


def test_gres_conf_uses_the_character_devices(tmp_path: Path) -> None:
    assert render_gres_conf(LabConfig(state_dir=tmp_path)).splitlines()[1] == (
        f"NodeName=n[1-4] Name=gpu File={tmp_path}/dev/nvidia[0-3]"
    )


def test_one_node_one_gpu(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path, nodes=1, gpus_per_node=1)
    assert "NodeName=n1 " in render_slurm_conf(cfg)
    assert render_gres_conf(cfg).endswith("File=" + str(tmp_path / "dev/nvidia0") + "\n")


def test_overlapping_ports_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="overlap"):
        LabConfig(state_dir=tmp_path, temporal_port=17002)


def test_node_names_are_made_resolvable_once(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.9 n2 # someone's own entry\n")
    assert ensure_node_hosts(["n1", "n2", "n3"], hosts) == ["n1", "n3"]
    assert ensure_node_hosts(["n1", "n2", "n3"], hosts) == []  # idempotent
    assert hosts.read_text().splitlines()[-1] == f"127.0.0.1 n1 n3 {HOSTS_MARK}"


def test_the_two_test_labs_hand_their_jobs_different_port_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs submitted with a lab's Slurm environment rendezvous in that lab's half of the demo port ranges."""
    from deploy.demo.ports import PORT_SLOT_ENV
    from deploy.local.slurm_cluster import SlurmCluster
    from tests.lab_support import LAB_SLOT_ENV, test_lab_config

    monkeypatch.setenv(PORT_SLOT_ENV, "1")  # an inherited value never decides: the lab's own config does
    slots = []
    for slot in ("0", "1"):
        monkeypatch.setenv(LAB_SLOT_ENV, slot)
        slots.append(SlurmCluster(test_lab_config()).env()[PORT_SLOT_ENV])
    assert slots == ["0", "1"]
