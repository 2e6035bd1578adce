"""Reading and writing the fake NVML's state file (one per lab node).

The fake ``libnvidia-ml.so.1`` (``deploy/local/fake_nvml/fake_nvml.c``) re-reads this text file on every call,
so appending a line changes what the next NVML call sees. Grammar (one directive a line, ``#`` comments):

    host n1                       # seeds the GPUs' UUIDs and PCI ids, so every node's GPUs differ
    driver 550.54.15
    count 4
    gpu 3 temp 91                 # and util/mem_used/power_mw/ecc_*/clocks_event/retired_pending/remap/...
    gpu 3 retired_sbe 4           # pages retired per cause (retired_dbe too); sm_clock / sm_clock_max in MHz
    gpu 3 lost 1                  # every per-device call then returns NVML_ERROR_GPU_IS_LOST
    gpu 3 recovery_action 2       # NVML's GPU recovery action field (2 = node reboot; 0 = none, the default)
    xid 3 79                      # event log: an XID critical error on GPU 3
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DRIVER_VERSION = "550.54.15"


def initial_state(host: str, gpu_count: int, driver: str = DEFAULT_DRIVER_VERSION) -> str:
    """The state of a healthy node: ``gpu_count`` GPUs, no events."""
    return f"# fake NVML state for node {host}\nhost {host}\ndriver {driver}\ncount {gpu_count}\n"


def write_initial_state(path: Path, host: str, gpu_count: int) -> None:
    """Write a healthy state atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(initial_state(host, gpu_count))
    os.replace(tmp, path)


def _append(path: Path, line: str) -> None:
    # O_APPEND writes of one short line are atomic with respect to the fake's reads.
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def append_xid(path: Path, gpu_index: int, xid: int) -> None:
    """Raise an XID critical-error event on one GPU."""
    _append(path, f"xid {gpu_index} {xid}")


def mark_gpu_lost(path: Path, gpu_index: int) -> None:
    """Make the GPU fall off the bus: every later per-device call fails with GPU_IS_LOST."""
    _append(path, f"gpu {gpu_index} lost 1")


def set_recovery_action(path: Path, gpu_index: int, code: int) -> None:
    """Set the GPU recovery action NVML reports (pynvml's ``NVML_GPU_RECOVERY_ACTION_*``: 0 none, 1 GPU reset,
    2 node reboot, 3 drain P2P, 4 drain and reset, ...; any other number is a value pynvml does not define)."""
    _append(path, f"gpu {gpu_index} recovery_action {code}")


def set_gpu_field(path: Path, gpu_index: int, field: str, *values: int | str) -> None:
    """Set any per-GPU field the grammar knows (``temp``, ``ecc_unc_vol``, ``clocks_event``, ...)."""
    rendered = " ".join(str(v) for v in values)
    _append(path, f"gpu {gpu_index} {field} {rendered}")
