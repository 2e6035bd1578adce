"""XID lines as the driver prints them: the Fatal/Nonfatal label of NVLink5 XIDs, XID 154's recovery action, and
what the GPU rules make of them. Every fixture is a real driver line (source named beside it)."""

from __future__ import annotations

import pytest

from activities.gpu.xid_catalog import default_xid_catalog
from workflows.domain.gpu import (
    GpuAction,
    GpuEvent,
    GpuEventKind,
    GpuHealthStatus,
    GpuRecoveryAction,
    GpuSample,
)
from workflows.policy.gpu_event_rules import event_findings, is_gpu_fault
from workflows.policy.gpu_health import gpu_health_verdict
from workflows.policy.xid_line import xid_line_facts

CATALOG = default_xid_catalog()
A = GpuRecoveryAction
H, D, F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED

# leptonai/gpud components/accelerator/nvidia/xid tests (kmsg captures of GB200 nodes).
FATAL_149 = (
    "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
    "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
NONFATAL_149 = (
    "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 "
    "(0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)"
)
NONFATAL_145 = (
    "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)"
)
# NVIDIA/TensorRT-LLM issue 4816 (B200 HGX), as the reporter pasted it.
NONFATAL_145_B200 = "NVRM: Xid (PCI:0000:5f:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02"
# A GPU health monitor's parser tests (public): the pre-R575 layout, and a TLW unit.
FATAL_149_OLD = "NVRM: Xid (PCI:0000:00:1e): 149, NETIR_LINK_EVT Fatal XC 1 i 2 Link 01 [0x0000000a]"
NONFATAL_146 = (
    "NVRM: Xid (PCI:0000:00:1e): 146, TLW_RX_PIPE1 Nonfatal XC0 i0 Link 03 "
    "(0x00000010 0x00000020 0x00000030 0x00000040)"
)
XID154_DRAIN_RESET = (
    "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) "
    "to 0x4 (Drain and Reset)"
)
XID154_GPU_RESET = (
    "[171168.537473] NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) "
    "to 0x1 (GPU Reset Required)"
)
XID154_REBOOT = (
    "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
)
# Another driver's words for the same numbers (a user's kernel log after XID 79; and after XID 51).
XID154_OS_REBOOT = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"
XID154_PF_FLR = "NVRM: Xid (PCI:0000:0d:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"
# The way back, in the same layout (the driver clears the action after the reset it asked for).
XID154_BACK_TO_NONE = (
    "NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
)
# Lines without a label: the number alone decides (gpud's dmesg capture of an H100).
XID13 = (
    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
    "(GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
)
XID79 = "NVRM: Xid (PCI:0000:02:00): 79, pid='<unknown>', GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "xid", "pci", "fatal"),
    [
        (FATAL_149, 149, "0009:01:00", True),
        (NONFATAL_149, 149, "0018:01:00", False),
        (NONFATAL_145, 145, "0000:04:00", False),
        (NONFATAL_145_B200, 145, "0000:5f:00", False),
        (FATAL_149_OLD, 149, "0000:00:1e", True),
        (NONFATAL_146, 146, "0000:00:1e", False),
        (XID13, 13, "0000:cb:00", None),
        (XID79, 79, "0000:02:00", None),
        (
            "NVRM: Xid (PCI:0000:3b:00): 145, pid=123, name=python, NVLINK: RLW (Nonfatal) link 2",
            145,
            "0000:3b:00",
            False,
        ),
    ],
)
def test_the_drivers_label_is_read(line: str, xid: int, pci: str, fatal: bool | None) -> None:
    facts = xid_line_facts(line)
    assert facts is not None
    assert (facts.xid, facts.pci_bus_id, facts.fatal) == (xid, pci, fatal)


@pytest.mark.parametrize(
    ("line", "before", "after"),
    [
        (XID154_DRAIN_RESET, A.NONE, A.DRAIN_AND_RESET),
        (XID154_GPU_RESET, A.DRAIN_AND_RESET, A.GPU_RESET),
        (XID154_REBOOT, A.NONE, A.NODE_REBOOT),
        (XID154_OS_REBOOT, A.NONE, A.NODE_REBOOT),
        (XID154_PF_FLR, A.NONE, A.GPU_RESET),
        (XID154_BACK_TO_NONE, A.GPU_RESET, A.NONE),
        ("NVRM: Xid (PCI:0000:02:00): 154, Node Reboot Required", None, A.NODE_REBOOT),
        (
            "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x9 (New)",
            A.NONE,
            A.UNKNOWN,
        ),
    ],
)
def test_xid_154_names_the_new_recovery_action(
    line: str, before: GpuRecoveryAction | None, after: GpuRecoveryAction
) -> None:
    facts = xid_line_facts(line)
    assert facts is not None and facts.xid == 154
    assert (facts.recovery_from, facts.recovery_to, facts.fatal) == (before, after, None)


def test_a_line_without_an_xid_has_no_facts() -> None:
    assert xid_line_facts("mlx5_core 0000:17:00.0: Port module event: module 0, Cable plugged") is None


def _event(line: str) -> GpuEvent:
    facts = xid_line_facts(line)
    assert facts is not None
    return GpuEvent(
        kind=GpuEventKind.XID,
        host="n1",
        index=0,
        xid=facts.xid,
        fatal=facts.fatal,
        recovery_action=facts.recovery_to,
        source="kmsg",
    )


@pytest.mark.parametrize(
    ("line", "status", "action", "fault"),
    [
        # The catalogue's row for 144-150 is a reset; the driver's Nonfatal label says no action.
        (NONFATAL_145, H, GpuAction.NONE, False),
        (NONFATAL_145_B200, H, GpuAction.NONE, False),
        (NONFATAL_149, H, GpuAction.NONE, False),
        (FATAL_149, F, GpuAction.RESET_GPU, True),
        (FATAL_149_OLD, F, GpuAction.RESET_GPU, True),
        (XID154_BACK_TO_NONE, H, GpuAction.NONE, False),
        (XID154_GPU_RESET, F, GpuAction.RESET_GPU, True),
        (XID154_PF_FLR, F, GpuAction.RESET_GPU, True),
        (XID154_DRAIN_RESET, F, GpuAction.RESET_GPU, True),
        (XID154_REBOOT, F, GpuAction.DRAIN_NODE, True),
        (XID154_OS_REBOOT, F, GpuAction.DRAIN_NODE, True),
        # Unlabelled lines keep the catalogue's verdict: 13 restarts the job, 79 drains.
        (XID13, D, GpuAction.RESTART_JOB, True),
        (XID79, F, GpuAction.DRAIN_NODE, True),
    ],
)
def test_the_line_outranks_the_catalogue(line: str, status: GpuHealthStatus, action: GpuAction, fault: bool) -> None:
    event = _event(line)
    (finding,) = event_findings(event, CATALOG, pinned=True)
    assert (finding.status, finding.action) == (status, action), finding.reason
    assert is_gpu_fault(event, CATALOG) is fault


def test_an_nvml_event_without_a_line_keeps_the_catalogue_verdict() -> None:
    # NVML's XID events carry the number only: 145 is then the catalogue's reset, 154 the catalogue's drain.
    for xid, action in ((145, GpuAction.RESET_GPU), (154, GpuAction.DRAIN_NODE)):
        event = GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=xid, source="nvml")
        (finding,) = event_findings(event, CATALOG, pinned=True)
        assert (finding.status, finding.action) == (F, action)


def test_an_informational_xid_and_a_source_down_are_not_faults() -> None:
    assert not is_gpu_fault(GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=43), CATALOG)
    assert not is_gpu_fault(GpuEvent(kind=GpuEventKind.SOURCE_DOWN, host="n1"), CATALOG)
    assert is_gpu_fault(GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=999), CATALOG)  # unknown: watched


@pytest.mark.parametrize(
    ("action", "status", "gpu_action"),
    [
        (A.GPU_RESET, F, GpuAction.RESET_GPU),
        (A.DRAIN_AND_RESET, F, GpuAction.RESET_GPU),
        (A.DRAIN_P2P, F, GpuAction.RESET_GPU),
        (A.BUS_RESET, F, GpuAction.RESET_GPU),
        (A.NODE_REBOOT, F, GpuAction.DRAIN_NODE),
        (A.SYSTEM_REBOOT, F, GpuAction.DRAIN_NODE),
        (A.RECOVER_IMEX_DOMAIN, F, GpuAction.DRAIN_NODE),
        (A.UNKNOWN, D, GpuAction.WATCH),
    ],
)
def test_the_sampled_recovery_action_decides_the_gpu(
    action: GpuRecoveryAction, status: GpuHealthStatus, gpu_action: GpuAction
) -> None:
    sick = GpuSample(host="n1", index=1, uuid="GPU-1", recovery_action=action, recovery_action_code=42)
    well = GpuSample(host="n1", index=0, uuid="GPU-0", recovery_action=A.NONE, recovery_action_code=0)
    v = gpu_health_verdict("n1", [well, sick], catalog=CATALOG, source="nvml")
    assert (v.status, v.action) == (status, gpu_action)
    assert v.gpus[0].findings == ()
    (finding,) = v.gpus[1].findings
    assert (finding.rule, finding.field) == ("recovery_action", "recovery_action")
    assert finding.value == ("42" if action is A.UNKNOWN else action.value)


def test_an_unread_recovery_action_is_not_none_and_no_finding() -> None:
    unread = GpuSample(host="n1", index=0, unsupported=("recovery_action",))
    assert unread.recovery_action is None
    v = gpu_health_verdict("n1", [unread], catalog=CATALOG)
    assert (v.status, v.gpus[0].findings) == (H, ())


def test_recovery_codes_follow_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    names = {
        "NONE": A.NONE,
        "GPU_RESET": A.GPU_RESET,
        "NODE_REBOOT": A.NODE_REBOOT,
        "DRAIN_P2P": A.DRAIN_P2P,
        "DRAIN_AND_RESET": A.DRAIN_AND_RESET,
        "RECOVER_IMEX_DOMAIN": A.RECOVER_IMEX_DOMAIN,
        "BUS_RESET": A.BUS_RESET,
        "SYSTEM_REBOOT": A.SYSTEM_REBOOT,
    }
    defined = {k[len("NVML_GPU_RECOVERY_ACTION_") :] for k in dir(pynvml) if k.startswith("NVML_GPU_RECOVERY_ACTION_")}
    assert defined == set(names), "pynvml defines recovery actions Rebound does not name"
    for name, action in names.items():
        assert A.from_code(getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}")) is action
    assert A.from_code(8) is A.UNKNOWN and A.from_code(-1) is A.UNKNOWN
