"""Slurm 22.05's ``squeue --json`` and ``sinfo --json`` records, field for field, for synthetic jobs and nodes.

Every field Slurm 22.05.8 prints (``openapi/v0.0.38``, the shape captured on the lab in ``tests/data/slurm``) is
present, in Slurm's order, so the benchmark's listings have the size and the parse cost of real ones (about 4 KB
a job with an 8-GPU node's allocation, indented as Slurm prints it) and go through Rebound's real parser
(``activities/slurm/parse.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["META", "job_record", "node_record"]

META: dict[str, Any] = {
    "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
    "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
}
#: ``end_time`` Slurm prints for a running job without a time limit: a projected year ahead.
_YEAR_S = 365 * 24 * 3600
_CLUSTER = "scale"
_PARTITION = "gpu"


def _allocation(node: str, cpus: int) -> dict[str, Any]:
    cores = {str(c): "allocated" for c in range(cpus // 2)}
    return {
        "nodes": node,
        "allocated_cores": cpus,
        "allocated_hosts": 1,
        "allocated_nodes": [
            {
                "sockets": {"0": {"cores": cores}, "1": {"cores": dict(cores)}},
                "nodename": node,
                "cpus_used": cpus,
                "memory_used": 0,
                "memory_allocated": 0,
            }
        ],
    }


def job_record(
    *,
    job_id: int,
    name: str,
    state: str,
    node: str,
    gpus: int,
    comment: str,
    user: tuple[str, int],
    workdir: str,
    submit_time: int,
    start_time: int,
    restart_count: int = 0,
    state_reason: str = "None",
    excluded: str = "",
    exit_code: int = 0,
) -> dict[str, Any]:
    """One job of ``squeue --json``: ``node`` is its one node (empty while pending), ``gpus`` its ranks."""
    user_name, uid = user
    cpus = gpus * 2
    running = bool(node) and state in ("RUNNING", "COMPLETING", "FAILED", "COMPLETED", "CANCELLED")
    return {
        "account": "",
        "accrue_time": submit_time,
        "admin_comment": "",
        "array_job_id": 0,
        "array_task_id": None,
        "array_max_tasks": 0,
        "array_task_string": "",
        "association_id": 0,
        "batch_features": "",
        "batch_flag": True,
        "batch_host": node if running else "",
        "flags": ["JOB_WAS_RUNNING"] if restart_count else [],
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": _CLUSTER,
        "cluster_features": "",
        "command": f"{workdir}/train.sbatch",
        "comment": comment,
        "container": "",
        "contiguous": False,
        "core_spec": None,
        "thread_spec": None,
        "cores_per_socket": None,
        "billable_tres": float(cpus),
        "cpus_per_task": 2,
        "cpu_frequency_minimum": None,
        "cpu_frequency_maximum": None,
        "cpu_frequency_governor": None,
        "cpus_per_tres": "",
        "deadline": 0,
        "delay_boot": 0,
        "dependency": "",
        "derived_exit_code": 0,
        "eligible_time": submit_time,
        "end_time": start_time + _YEAR_S if running else 0,
        "excluded_nodes": excluded,
        "exit_code": exit_code,
        "features": "",
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": [f"gpu:{gpus}(IDX:0-{gpus - 1})"] if running else [],
        "group_id": uid,
        "group_name": user_name,
        "job_id": job_id,
        "job_resources": _allocation(node, cpus) if running else {},
        "job_state": state,
        "last_sched_evaluation": start_time or submit_time,
        "licenses": "",
        "max_cpus": 0,
        "max_nodes": 0,
        "mcs_label": "",
        "memory_per_tres": "",
        "name": name,
        "nodes": node if running else "",
        "nice": None,
        "tasks_per_core": None,
        "tasks_per_node": gpus,
        "tasks_per_socket": None,
        "tasks_per_board": 0,
        "cpus": cpus,
        "node_count": 1,
        "tasks": gpus,
        "het_job_id": 0,
        "het_job_id_set": "",
        "het_job_offset": 0,
        "partition": _PARTITION,
        "prefer": "",
        "memory_per_node": None,
        "memory_per_cpu": None,
        "minimum_cpus_per_node": cpus,
        "minimum_tmp_disk_per_node": 0,
        "preempt_time": 0,
        "pre_sus_time": 0,
        "priority": 4294901759 - job_id,
        "profile": None,
        "qos": "",
        "reboot": False,
        "required_nodes": "",
        "requeue": True,
        "resize_time": 0,
        "restart_cnt": restart_count,
        "resv_name": "",
        "shared": None,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
        "sockets_per_board": 0,
        "sockets_per_node": None,
        "start_time": start_time,
        "state_description": "",
        "state_reason": state_reason,
        "standard_error": "",
        "standard_input": "/dev/null",
        "standard_output": f"{workdir}/slurm-%j.out",
        "submit_time": submit_time,
        "suspend_time": 0,
        "system_comment": "",
        "time_limit": 525600,
        "time_minimum": 0,
        "threads_per_core": None,
        "tres_bind": "",
        "tres_freq": "",
        "tres_per_job": "",
        "tres_per_node": f"gres:gpu:{gpus}",
        "tres_per_socket": "",
        "tres_per_task": "",
        "tres_req_str": f"cpu={cpus},mem=64000M,node=1,billing={cpus},gres/gpu={gpus}",
        "tres_alloc_str": f"cpu={cpus},node=1,billing={cpus},gres/gpu={gpus}" if running else "",
        "user_id": uid,
        "user_name": user_name,
        "wckey": "",
        "current_working_directory": workdir,
    }


def node_record(
    *,
    name: str,
    gpus: int,
    allocated: bool,
    drain: bool,
    reason: str,
    reason_by: str | None,
    reason_at: int,
    boot_time: int,
    port: int,
) -> dict[str, Any]:
    """One node of ``sinfo --json``: ``allocated`` when a job runs on it; a drain shows as the ``DRAIN`` flag."""
    cpus = gpus * 2
    used = cpus if allocated else 0
    return {
        "architecture": "x86_64",
        "burstbuffer_network_address": "",
        "boards": 1,
        "boot_time": boot_time,
        "comment": "",
        "cores": cpus // 2,
        "cpu_binding": 0,
        "cpu_load": 100 * used,
        "extra": "",
        "free_memory": 900000,
        "cpus": cpus,
        "last_busy": boot_time,
        "features": "",
        "active_features": "",
        "gres": f"gpu:{gpus}",
        "gres_drained": "N/A",
        "gres_used": f"gpu:{gpus if allocated else 0}",
        "mcs_label": "",
        "name": name,
        "next_state_after_reboot": "invalid",
        "address": name,
        "hostname": name,
        "state": "allocated" if allocated else "idle",
        "state_flags": ["DRAIN"] if drain else [],
        "next_state_after_reboot_flags": [],
        "operating_system": "Linux 5.15.0-synthetic #1 SMP",
        "owner": None,
        "partitions": [_PARTITION],
        "port": port,
        "real_memory": 1000000,
        "reason": reason,
        "reason_changed_at": reason_at,
        "reason_set_by_user": reason_by,
        "slurmd_start_time": boot_time,
        "sockets": 2,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": f"cpu={cpus},mem=1000000M,billing={cpus},gres/gpu={gpus}",
        "slurmd_version": "22.05.8",
        "alloc_memory": 0,
        "alloc_cpus": used,
        "idle_cpus": cpus - used,
        "tres_used": f"cpu={used},gres/gpu={gpus}" if allocated else "",
        "tres_weighted": float(used),
    }
