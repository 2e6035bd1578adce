"""Job-log lines whose severity the line itself decides: NVLink5 XIDs the driver labels Nonfatal, XID 154's recovery
action, benign mlx5 notices against real mlx5 errors, and Slurm's short memory messages. Real lines throughout
(sources beside them; the NVRM ones are shared with ``tests/unit/policy/test_xid_line.py``)."""

from __future__ import annotations

import pytest

from activities.logs.signature_types import Category, Role
from activities.logs.signatures import match, prepare
from tests.unit.policy.test_xid_line import (
    FATAL_149,
    FATAL_149_OLD,
    NONFATAL_145,
    NONFATAL_145_B200,
    NONFATAL_146,
    NONFATAL_149,
    XID154_BACK_TO_NONE,
    XID154_GPU_RESET,
    XID154_REBOOT,
)
from workflows.domain.incident import FailureClass

C = Category


def _hit(line: str) -> tuple[str, Category, Role] | None:
    m = match(prepare(line).body)
    return None if m is None else (m.signature.id, m.category, m.role)


@pytest.mark.parametrize("line", [NONFATAL_145, NONFATAL_145_B200, NONFATAL_146, NONFATAL_149, XID154_BACK_TO_NONE])
def test_an_xid_the_driver_says_needs_nothing_is_context(line: str) -> None:
    m = match(prepare(line).body)
    assert m is not None and m.signature.id == "nvrm_xid"
    assert (m.category, m.role) == (C.NONE, Role.INFO), m.detail
    assert "Nonfatal" in m.detail or "back to None" in m.detail


@pytest.mark.parametrize("line", [FATAL_149, FATAL_149_OLD, XID154_GPU_RESET, XID154_REBOOT])
def test_a_fatal_nvlink_xid_and_a_recovery_action_are_the_gpus(line: str) -> None:
    m = match(prepare(line).body)
    assert m is not None and m.signature.id == "nvrm_xid"
    assert (m.category, m.role, m.failure_class) == (C.XID, Role.CULPRIT, FailureClass.HARDWARE), m.detail


@pytest.mark.parametrize(
    "line",
    [
        # The kernel mailing list (netboot of a ConnectX-5) and a DGX Spark's hot-plug log: info-level module events.
        "May 27 15:47:46 manet kernel: mlx5_core 0000:81:00.0: Port module event: module 0, Cable plugged",
        "[ 71.592299] mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged",
        # A port coming up (a blog's ConnectX-7 bring-up).
        "mlx5_core 0000:01:00.0 enp1s0f0np0: Link up",
        "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down",
        "mlx5_core 0000:81:00.0: mlx5_pcie_event:301:(pid 10): PCIe slot advertised sufficient power (27W).",
        # The write-combining probe at device init (linux-rdma list): the driver goes on without it.
        "infiniband mlx5_0: mlx5_ib_test_wc:290:(pid 66740): Error -28 while trying to test write-combining support",
    ],
)
def test_benign_mlx5_notices_are_not_infiniband_errors(line: str) -> None:
    assert _hit(line) is None


@pytest.mark.parametrize(
    "line",
    [
        # mlx5's error-level module event (drivers/net/ethernet/mellanox/mlx5/core/events.c), as a health monitor's
        # tests record it, and the firmware's fatal reporter.
        "kernel: [123.456794] mlx5_core 0000:5c:00.0: Port module event[error]: module 0, Cable error,"
        " High Temperature",
        "Jan 12 04:11:09 gpu-n4 kernel: mlx5_core 0000:41:00.0: mlx5_fw_fatal_reporter_err_work:2029:(pid 1234): Driver"
        " is in error state. Unloading",
    ],
)
def test_mlx5_errors_still_are(line: str) -> None:
    assert _hit(line) == ("ib_error", C.NETWORK_IB_ERROR, Role.VICTIM)


@pytest.mark.parametrize(
    ("line", "row", "category"),
    [
        # Short Slurm messages (srun's and slurmstepd's own words).
        ("srun: error: Node failure on n3", "srun_node_failure", C.SLURM_NODE_FAILURE),
        (
            "slurmstepd: error: *** JOB 12 ON n2 CANCELLED AT 2026-12-06T06:10:11 DUE TO NODE FAILURE ***",
            "stepd_node_failure",
            C.SLURM_NODE_FAILURE,
        ),
        ("srun: error: n1: task 3: Killed", "srun_task_killed", C.SLURM_TASK_EXIT),
        ("srun: error: n4: task 7: Out Of Memory", "srun_task_oom", C.HOST_OOM),
        (
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.0. Some of your processes may have been "
            "killed by the cgroup out-of-memory handler.",
            "oom_kill",
            C.HOST_OOM,
        ),
        # Slurm's memory accounting (jobacct_gather, and the cgroup's failcnt at the step's end; FAQ pages quote it).
        ("slurmstepd: error: Exceeded step memory limit at some point.", "oom_kill", C.HOST_OOM),
        ("slurmstepd: error: Exceeded job memory limit", "oom_kill", C.HOST_OOM),
        (
            "slurmstepd: error: Step 12.0 exceeded memory limit (123456 > 100000), being killed",
            "oom_kill",
            C.HOST_OOM,
        ),
    ],
)
def test_short_slurm_messages(line: str, row: str, category: Category) -> None:
    hit = _hit(line)
    assert hit is not None and hit[:2] == (row, category)


def test_a_memory_limit_in_someone_elses_words_is_not_slurms() -> None:
    assert _hit("Split buffering for db.t in query 7 exceeded memory limit (2GB). 10 splits are buffered.") is None
