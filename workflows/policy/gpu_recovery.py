"""The driver's GPU recovery action as a health verdict. Pure.

Drivers from R570 report what a GPU needs to recover: NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` field (read
into ``GpuSample.recovery_action``) and XID 154 when it changes (its new value in ``GpuEvent.recovery_action``).
The driver's word is the most direct evidence there is, so it maps straight onto Rebound's actions:

- ``none``: nothing to do (XID 154 back to None closes an earlier action; it is not a fault).
- ``gpu_reset``, ``drain_and_reset``, ``drain_p2p``, ``bus_reset`` -> FAILED, reset the GPU: a reset (of the GPU
  or its PCIe bus) after the work is drained clears it, so the node is drained, reset and returned. Drain P2P
  means peer-to-peer traffic (NVLink, the collectives of every multi-GPU job) must stop: for training the GPU is
  as unusable as one that needs a reset, which is what the driver asks for after the drain.
- ``node_reboot``, ``system_reboot`` -> FAILED, drain the node: only a reboot clears it.
- ``recover_imex_domain`` -> FAILED, drain the node: the multi-node NVLink (IMEX) domain must be recovered, an
  operator's action beyond this node.
- ``unknown`` (a number pynvml does not define) -> DEGRADED, watch: the driver asks for something Rebound cannot
  name; ``nvidia-smi -q`` says what.
"""

from __future__ import annotations

from workflows.domain.gpu import GpuAction, GpuHealthStatus, GpuRecoveryAction

__all__ = ["recovery_verdict"]

_H, _D, _F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED
_A = GpuRecoveryAction

_VERDICTS: dict[GpuRecoveryAction, tuple[GpuHealthStatus, GpuAction, str]] = {
    _A.NONE: (_H, GpuAction.NONE, "no recovery action needed"),
    _A.GPU_RESET: (_F, GpuAction.RESET_GPU, "the driver requires a GPU reset"),
    _A.DRAIN_AND_RESET: (_F, GpuAction.RESET_GPU, "the driver requires draining the GPU's work, then a GPU reset"),
    _A.DRAIN_P2P: (
        _F,
        GpuAction.RESET_GPU,
        "the driver requires draining peer-to-peer (NVLink) work, then a GPU reset: no collective can use it",
    ),
    _A.BUS_RESET: (_F, GpuAction.RESET_GPU, "the driver requires a reset of the GPU's PCIe bus"),
    _A.NODE_REBOOT: (_F, GpuAction.DRAIN_NODE, "the driver requires a node reboot"),
    _A.SYSTEM_REBOOT: (_F, GpuAction.DRAIN_NODE, "the driver requires a system reboot"),
    _A.RECOVER_IMEX_DOMAIN: (
        _F,
        GpuAction.DRAIN_NODE,
        "the driver requires recovering the IMEX (multi-node NVLink) domain: an operator's action",
    ),
    _A.UNKNOWN: (_D, GpuAction.WATCH, "a recovery action this pynvml does not define: check nvidia-smi -q"),
}


def recovery_verdict(action: GpuRecoveryAction) -> tuple[GpuHealthStatus, GpuAction, str]:
    """What the driver's recovery action means: status, Rebound's action and a sentence."""
    return _VERDICTS[action]
