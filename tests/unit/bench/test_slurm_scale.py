from __future__ import annotations

from pathlib import Path

from deploy.bench.scale_probe import census_of
from deploy.bench.scale_report import format_table, summarize
from deploy.bench.slurm_scale import ScaleOptions, sbatch_argv, scale_lab_config
from deploy.local.config import LabConfig
from deploy.local.slurm_config import render_slurm_conf
from tests.lab_support import test_lab_config as e2e_lab_config
from workflows.policy.optin import parse_comment


def test_the_scale_lab_has_its_own_ports_dir_and_cluster(tmp_path: Path) -> None:
    cfg = scale_lab_config(ScaleOptions(state_dir=tmp_path / "scale"))
    default, e2e = LabConfig(state_dir=tmp_path / "default", nodes=5), e2e_lab_config()
    ours = set(cfg.all_ports().values())
    assert not ours & set(default.all_ports().values())
    assert not ours & set(e2e.all_ports().values())
    assert cfg.cluster_name not in (default.cluster_name, e2e.cluster_name)
    assert cfg.state_dir not in (default.state_dir, e2e.state_dir)


def test_a_cpu_for_every_job_on_64_nodes(tmp_path: Path) -> None:
    cfg = scale_lab_config(ScaleOptions(state_dir=tmp_path, nodes=64, jobs=1000))
    assert cfg.cpus_per_node * cfg.nodes >= 1000
    assert cfg.agent_groups() == [("agent-n1-n64", tuple(f"n{i}" for i in range(1, 65)))]
    conf = render_slurm_conf(cfg)
    assert "NodeName=n[1-64]" in conf and "Port=[17101-17164]" in conf and "CPUs=16" in conf
    assert "SlurmdTimeout=30" in conf  # a late ping on a loaded host must not kill 64 nodes' jobs


def test_each_job_opts_in_with_its_own_output(tmp_path: Path) -> None:
    argv = sbatch_argv(tmp_path, 7, 1.0)
    assert argv[0] == "sbatch" and argv[-2].endswith("scale_job.sh") and argv[-1] == "1"
    comment = next(a for a in argv if a.startswith("--comment=")).removeprefix("--comment=")
    output = next(a for a in argv if a.startswith("--output=")).removeprefix("--output=")
    spec = parse_comment(comment)
    assert spec is not None and list(spec.logs) == [output]
    assert "--cpus-per-task=1" in argv and "--ntasks=1" in argv


def test_census_sorts_jobs_by_their_pending_activities() -> None:
    census = census_of(
        {
            1: [("job_watch", True)],
            2: [("job_watch", False)],
            3: [("job_log_anchor", False)],
            4: [("attribute_failure", True)],
            5: [],
        }
    )
    assert census.watching == (1,) and census.watch_waiting == (2,) and census.anchor_waiting == (3,)
    assert census.other == (4, 5) and census.workflows == 5


def _result() -> dict[str, object]:
    read = {"wall_s": 0.5, "cpu_s": 0.4, "bytes": 4_000_000, "parse_s": 0.2, "items": 1000}
    return {
        "nodes": 64,
        "jobs": 1000,
        "cpus_per_node": 16,
        "submit_s": 30.0,
        "all_running_s": 40.0,
        "all_monitored_s": 90.0,
        "lab_up_s": 20.0,
        "load_before": (1.0, 1.0, 1.0),
        "load_steady": (5.0, 4.0, 3.0),
        "mem_used_by_lab_mb": 4000.0,
        "census": {"workflows": 1000, "watching": 99, "watch_waiting": 901, "anchor_waiting": 0, "other": 0},
        "cpu_cores": {"worker": 0.9, "machine": 1.9, "window_s": 60.0},
        "rss_mb": {"worker": 300.0},
        "reads": [
            {**read, "command": "squeue --json"},
            {**read, "command": "squeue --json", "wall_s": 0.7},
            {**read, "command": "sinfo --json", "items": 64},
        ],
        "faults": [
            {"fault": "kill", "watched": True, "detected_s": 1.5, "seen_s": 2.0, "action_s": 10.0},
            {"fault": "kill", "watched": False, "detected_s": None, "action_s": None},
            {"fault": "xid79", "watched": False, "detected_s": 0.2, "action_s": None},
        ],
        "false_incidents": {"-1": ["2 unanswered"]},
    }


def test_summary_keeps_watched_and_unwatched_apart() -> None:
    summary = summarize(_result())
    assert summary["reads"]["squeue --json"]["wall_s"] == {"p50": 0.6, "max": 0.7}
    assert summary["faults"]["kill watched"]["detected"] == 1
    assert summary["faults"]["kill watched"]["seen_s"] == {"p50": 2.0, "max": 2.0}
    assert summary["faults"]["kill unwatched"] == {
        "jobs": 1,
        "detected": 0,
        "acted": 0,
        "detection_s": {"p50": None, "max": None},
        "seen_s": {"p50": None, "max": None},
        "action_s": {"p50": None, "max": None},
    }
    assert summary["faults"]["xid79 unwatched"]["detected"] == 1


def test_table_names_the_ceiling() -> None:
    result = _result()
    result["summary"] = summarize(result)
    table = format_table(result)
    assert "99 running, 901 scheduled never started" in table
    assert "kill unwatched" in table and "2 unanswered" in table
