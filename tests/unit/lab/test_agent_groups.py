from __future__ import annotations

from pathlib import Path

from deploy.local.config import LabConfig
from deploy.local.services import ReboundServices


def test_one_agent_per_node_by_default(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path, nodes=3)
    assert cfg.agent_groups() == [("agent-n1", ("n1",)), ("agent-n2", ("n2",)), ("agent-n3", ("n3",))]
    argv = ReboundServices(cfg).agent_argv(("n1",))
    assert argv[-3:] == ["-m", "workers.cli", "node-agent"]


def test_one_process_serves_a_group_of_nodes(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path, nodes=64, nodes_per_agent=64)
    groups = cfg.agent_groups()
    assert len(groups) == 1
    service, nodes = groups[0]
    assert service == "agent-n1-n64"
    assert nodes == tuple(f"n{i}" for i in range(1, 65))
    services = ReboundServices(cfg)
    argv = services.agent_argv(nodes)
    assert argv[1:3] == ["-m", "deploy.local.node_agents"]
    assert argv[argv.index("--nodes") + 1].split(",") == list(nodes)
    # The process reads the same state files the lab's injector appends to.
    assert argv[argv.index("--nvml-state-dir") + 1] == str(cfg.layout.nvml_dir)
    assert services.services() == ["worker", "agent-n1-n64"]
    env = services.shared_agent_env()
    assert env["REBOUND_NODE_AGENT__SLURM_CLUSTER"] == cfg.cluster_name
    assert "REBOUND_NODE_AGENT__NODE_NAME" not in env


def test_a_last_smaller_group(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path, nodes=5, nodes_per_agent=2)
    assert [s for s, _ in cfg.agent_groups()] == ["agent-n1-n2", "agent-n3-n4", "agent-n5"]
