"""Generated ``squeue --json`` / ``sinfo --json`` documents of any size, shaped like Slurm 22.05's.

Each job and node record carries every field a real 22.05.8 record has (``tests/data/slurm/squeue.json`` and
``sinfo.json``, captured on a real cluster), pretty-printed as the CLI prints them, so sizes and parse costs are
the real ones: about 4 KB of ``squeue --json`` per job (40 MB at 10,000 jobs; the capture's records are 3.1 to
3.7 KB) and 1.3 KB of ``sinfo --json`` per node. The cluster: one
8-GPU node per running job (``n00001``...), 9 jobs in 10 running, every 10th pending, partitions ``gpu`` (all
nodes) and ``debug`` (every 16th node); every 50th node drained by someone else, every 97th not responding.
Deterministic: the same arguments give the same bytes. Used by the cost measurements (``workers.bench.costs``)
and by tests that need a cluster of realistic size.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["node_name", "sinfo_document", "squeue_document"]

_T0 = 1796009255
_META = {
    "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
    "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
}


def node_name(index: int) -> str:
    """The name of node ``index`` (0-based): ``n00001`` for 0."""
    return f"n{index + 1:05d}"


def squeue_document(jobs: int, *, nodes: int | None = None, indent: int | None = 2) -> bytes:
    """``squeue --json -a`` of ``jobs`` jobs on ``nodes`` nodes (default: one node per running job).

    Pretty-printed as the CLI prints it (``indent=2``); ``indent=None`` gives slurmrestd's compact form.
    """
    n_nodes = nodes if nodes is not None else max(1, jobs - jobs // 10)
    records = [_job(i, n_nodes) for i in range(jobs)]
    return json.dumps({"meta": _META, "errors": [], "jobs": records}, indent=indent).encode()


def sinfo_document(nodes: int, *, indent: int | None = 2) -> bytes:
    """``sinfo --json`` of ``nodes`` nodes."""
    records = [_node(i) for i in range(nodes)]
    return json.dumps({"meta": _META, "errors": [], "nodes": records}, indent=indent).encode()


def _job(i: int, n_nodes: int) -> dict[str, Any]:
    job_id = 1000 + i
    pending = i % 10 == 9
    node = "" if pending else node_name(i % n_nodes)
    user = f"user{i % 200:03d}"
    allocated = (
        []
        if pending
        else [
            {
                "sockets": {"0": {"cores": {str(c): "allocated" for c in range(8)}}},
                "nodename": node,
                "cpus_used": 8,
                "memory_used": 0,
                "memory_allocated": 64000,
            }
        ]
    )
    return {
        "account": "ml", "accrue_time": _T0, "admin_comment": "", "array_job_id": 0, "array_task_id": None,
        "array_max_tasks": 0, "array_task_string": "", "association_id": 0, "batch_features": "",
        "batch_flag": True, "batch_host": node, "flags": [] if pending else ["JOB_WAS_RUNNING"],
        "burst_buffer": "", "burst_buffer_state": "", "cluster": "synthetic", "cluster_features": "",
        "command": f"/home/{user}/train-{job_id}.sbatch", "comment": "rebound:watch" if i % 3 == 0 else "",
        "container": "", "contiguous": False, "core_spec": None, "thread_spec": None, "cores_per_socket": None,
        "billable_tres": 8.0, "cpus_per_task": 1, "cpu_frequency_minimum": None, "cpu_frequency_maximum": None,
        "cpu_frequency_governor": None, "cpus_per_tres": "", "deadline": 0, "delay_boot": 0, "dependency": "",
        "derived_exit_code": 0, "eligible_time": _T0 + i % 600, "end_time": _T0 + 31536000 + i,
        "excluded_nodes": "", "exit_code": 0, "features": "", "federation_origin": "",
        "federation_siblings_active": "", "federation_siblings_viable": "",
        "gres_detail": [] if pending else ["gpu:8(IDX:0-7)"], "group_id": 1000 + i % 200, "group_name": user,
        "job_id": job_id,
        "job_resources": {}
        if pending
        else {"nodes": node, "allocated_cores": 8, "allocated_hosts": 1, "allocated_nodes": allocated},
        "job_state": "PENDING" if pending else "RUNNING", "last_sched_evaluation": _T0 + i % 600,
        "licenses": "", "max_cpus": 0, "max_nodes": 0, "mcs_label": "", "memory_per_tres": "",
        "name": f"train-{i % 997}", "nodes": node, "nice": None, "tasks_per_core": None, "tasks_per_node": 8,
        "tasks_per_socket": None, "tasks_per_board": 0, "cpus": 8, "node_count": 1, "tasks": 8,
        "het_job_id": 0, "het_job_id_set": "", "het_job_offset": 0, "partition": "gpu", "prefer": "",
        "memory_per_node": 64000, "memory_per_cpu": None, "minimum_cpus_per_node": 8,
        "minimum_tmp_disk_per_node": 0, "preempt_time": 0, "pre_sus_time": 0, "priority": 4294901759 - i,
        "profile": None, "qos": "normal", "reboot": False, "required_nodes": "", "requeue": True,
        "resize_time": 0, "restart_cnt": i % 3, "resv_name": "", "shared": None,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"], "sockets_per_board": 0,
        "sockets_per_node": None, "start_time": _T0 + 1 + i % 600, "state_description": "",
        "state_reason": "Resources" if pending else "None", "standard_error": "",
        "standard_input": "/dev/null", "standard_output": f"/home/{user}/runs/train-%j.out",
        "submit_time": _T0 + i % 600, "suspend_time": 0, "system_comment": "", "time_limit": 525600,
        "time_minimum": 0, "threads_per_core": None, "tres_bind": "", "tres_freq": "", "tres_per_job": "",
        "tres_per_node": "gres:gpu:8", "tres_per_socket": "", "tres_per_task": "",
        "tres_req_str": "cpu=8,mem=64000M,node=1,billing=8,gres/gpu=8",
        "tres_alloc_str": "" if pending else "cpu=8,mem=64000M,node=1,billing=8,gres/gpu=8",
        "user_id": 1000 + i % 200, "user_name": user, "wckey": "", "current_working_directory": f"/home/{user}/runs",
    }  # fmt: skip


def _node(i: int) -> dict[str, Any]:
    drained, silent = i % 50 == 49, i % 97 == 96
    return {
        "architecture": "x86_64", "burstbuffer_network_address": "", "boards": 1, "boot_time": _T0 - 86400,
        "comment": "", "cores": 32, "cpu_binding": 0, "cpu_load": 800, "extra": "", "free_memory": 900000,
        "cpus": 64, "last_busy": _T0, "features": "h100", "active_features": "h100", "gres": "gpu:8",
        "gres_drained": "N/A", "gres_used": "gpu:8(IDX:0-7)", "mcs_label": "", "name": node_name(i),
        "next_state_after_reboot": "invalid", "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
        "hostname": node_name(i), "state": "down" if silent else "mixed",
        "state_flags": (["DRAIN"] if drained else []) + (["NOT_RESPONDING"] if silent else []),
        "next_state_after_reboot_flags": [], "operating_system": "Linux 6.8.0 #1 SMP PREEMPT_DYNAMIC",
        "owner": None, "partitions": ["gpu", "debug"] if i % 16 == 0 else ["gpu"], "port": 6818,
        "real_memory": 1000000, "reason": "maintenance by ops" if drained else "",
        "reason_changed_at": _T0 if drained else 0, "reason_set_by_user": "ops" if drained else None,
        "slurmd_start_time": _T0 - 86000, "sockets": 2, "threads": 1, "temporary_disk": 0, "weight": 1,
        "tres": "cpu=64,mem=1000000M,billing=64,gres/gpu=8", "slurmd_version": "22.05.8",
        "alloc_memory": 64000, "alloc_cpus": 8, "idle_cpus": 56, "tres_used": "cpu=8,mem=64000M,gres/gpu=8",
        "tres_weighted": 8.0,
    }  # fmt: skip
