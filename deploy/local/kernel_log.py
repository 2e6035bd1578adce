"""The lab's kernel-log injector: kernel-style lines appended to a node's file-backed kernel log.

The lab's nodes share one kernel, so a fault cannot be written into "their" ``/dev/kmsg``. Each lab node's agent
reads a file instead (``LabLayout.kernel_log``, ``REBOUND_NODE_AGENT__KERNEL_LOG``); this writes the lines a real
driver would print there, naming the fake GPUs' PCI bus ids as the fake NVML reports them, so the agent must map
the id to the GPU index just as on a real node.
"""

from __future__ import annotations

import os
from pathlib import Path

from deploy.local.fake_nvml import fake_pci_bus_id

__all__ = ["append_kernel_line", "kernel_pci", "sxid_line", "xid_line"]

#: The NVSwitch the lab's SXid lines name (a fake node has no NVSwitch in NVML's view: the SXid stays on the node).
LAB_NVSWITCH_PCI = "0000:05:00.0"


def kernel_pci(host: str, gpu: int) -> str:
    """A fake GPU's bus id the way NVRM prints it (``0000:18:00``: a 4-digit domain, no function)."""
    domain, bus, rest = fake_pci_bus_id(host, gpu).split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.split('.')[0]}"


def xid_line(host: str, gpu: int, xid: int, text: str = "GPU has fallen off the bus.") -> str:
    """An NVRM XID line for GPU ``gpu`` of ``host`` (the driver's format: ``NVRM: Xid (PCI:0000:18:00): 79, ...``)."""
    return f"NVRM: Xid (PCI:{kernel_pci(host, gpu)}): {xid}, pid='<unknown>', name=<unknown>, {text}"


def sxid_line(sxid: int, *, fatal: bool, switch: int = 0, link: int = 32, text: str = "") -> str:
    """An NVSwitch SXid line (``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...``)."""
    label = "Fatal" if fatal else "Non-fatal"
    line = f"nvidia-nvswitch{switch}: SXid (PCI:{LAB_NVSWITCH_PCI}): {sxid:05d}, {label}, Link {link:02d} {text}"
    return line.rstrip()


def append_kernel_line(path: Path, line: str) -> None:
    """Append one line in a single write (a reader never sees half of it: it reads complete lines only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)
