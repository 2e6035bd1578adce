"""The lab's kernel logs: one file per fake node, driver-style lines naming the fake GPUs' bus ids."""

from __future__ import annotations

from pathlib import Path

from activities.kernel.lines import normalize_pci, parse_line
from activities.kernel.sxid_catalog import default_sxid_catalog
from deploy.local.config import LabConfig
from deploy.local.fake_nvml import fake_pci_bus_id
from deploy.local.kernel_log import append_kernel_line, sxid_line, xid_line
from deploy.local.node_agents import fake_node_settings
from deploy.local.services import ReboundServices
from workers.settings import Settings


def test_injected_lines_parse_to_the_fake_gpus_bus_id(tmp_path: Path) -> None:
    log = tmp_path / "kernel" / "n3.log"
    append_kernel_line(log, xid_line("n3", 2, 79))
    append_kernel_line(log, sxid_line(12028, fatal=False, text="egress non-posted PRIV error (First)"))
    xid_text, sxid_text = log.read_text().splitlines()
    xid = parse_line(xid_text, host="n3", sxids=default_sxid_catalog())
    assert xid is not None and xid.xid == 79 and xid.pci_bus_id == normalize_pci(fake_pci_bus_id("n3", 2))
    sxid = parse_line(sxid_text, host="n3", sxids=default_sxid_catalog())
    assert sxid is not None and sxid.sxid == 12028


def test_each_lab_agent_reads_its_own_file_and_fake_nodes_never_the_hosts_kmsg(tmp_path: Path) -> None:
    services = ReboundServices(LabConfig(state_dir=tmp_path))
    assert services.kernel_log_setting() == str(tmp_path / "kernel" / "{node}.log")
    assert services.agent_env("n1")["REBOUND_NODE_AGENT__KERNEL_LOG"] == services.kernel_log_setting()
    assert Settings().node_agent.kernel_log == "/dev/kmsg"  # a real node's default
    assert fake_node_settings(Settings()).node_agent.kernel_log == ""  # the scale benchmark's fake nodes: none
    lab = Settings.model_validate({"node_agent": {"kernel_log": services.kernel_log_setting()}})
    assert fake_node_settings(lab).node_agent.kernel_log == services.kernel_log_setting()
