"""The signature library's vocabulary: failure categories and their defaults, roles, and the shape of a row.

``CATEGORIES`` gives each canonical failure category (``Category``) its default ``failure_class``, ``restartable``
(can a restart, elsewhere, help?) and ``tier`` (how strongly it explains a failure: hardware evidence > a rank's own
error > a communication error > a launcher's summary). ``Signature`` is one row of
``activities.logs.signature_table``, built by ``row`` (which fills in the category's defaults and compiles the
regex); ``Prepared`` and ``SignatureMatch`` are what ``activities.logs.signatures`` makes of a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from workflows.domain.findings import FindingKind
from workflows.domain.incident import FailureClass

__all__ = [
    "CATEGORIES",
    "EXCEPTION_NAME",
    "PCI_ID",
    "Category",
    "CategoryInfo",
    "Prepared",
    "Role",
    "Signature",
    "SignatureMatch",
    "row",
]


EXCEPTION_NAME = r"(?P<exception>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"
"""An exception's (dotted) type name, as the ``exception`` group: ``torch.OutOfMemoryError``."""
PCI_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
"""A PCI bus id as the kernel and nvidia-smi print it: ``0000:3b:00``, ``00000000:3B:00.0``."""


class Category(StrEnum):
    """The canonical failure categories (docs/detection.md has the table)."""

    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    GLOO_ERROR = "gloo_error"
    CUDA_ILLEGAL_ADDRESS = "cuda_illegal_address"
    CUDA_LAUNCH_FAILURE = "cuda_launch_failure"
    CUDA_ECC = "cuda_ecc"
    CUDA_DEVICE_ASSERT = "cuda_device_assert"
    CUDA_UNKNOWN_ERROR = "cuda_unknown_error"
    CUDA_INIT_FAILURE = "cuda_init_failure"
    XID = "xid"
    GPU_FELL_OFF_BUS = "gpu_fell_off_bus"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    SEGFAULT = "segfault"
    BUS_ERROR = "bus_error"
    DATALOADER_KILLED = "dataloader_killed"
    ELASTIC_CHILD_FAILED = "elastic_child_failed"
    USER_EXCEPTION = "user_exception"
    CHECKPOINT_IO_ERROR = "checkpoint_io_error"
    NETWORK_IB_ERROR = "network_ib_error"
    SLURM_NODE_FAILURE = "slurm_node_failure"
    SLURM_TIME_LIMIT = "slurm_time_limit"
    SLURM_PREEMPTION = "slurm_preemption"
    SLURM_TASK_EXIT = "slurm_task_exit"
    NAN_LOSS = "nan_loss"
    NONE = "none"


class Role(StrEnum):
    CULPRIT = "culprit"
    """This rank or node failed by itself."""
    VICTIM = "victim"
    """It failed because a peer did (a gloo/NCCL peer error, srun terminating the survivors)."""
    INFO = "info"
    """Context (a requeue, a summary block, an informational XID), not a failure of its own."""


class CategoryInfo(NamedTuple):
    failure_class: FailureClass | None
    restartable: bool | None
    tier: int
    """How strongly it explains a failure: 6 the kernel's word on a GPU (an XID, a GPU off the bus), 5 other hardware
    evidence (uncorrectable ECC, InfiniBand, a lost node), 4 a rank's own error or the scheduler's verdict, 3 a
    communication error (a victim's view), 2 a launcher's summary, 1 srun's summary, 0 not a failure."""


_H, _I, _U, _X = FailureClass.HARDWARE, FailureClass.INFRASTRUCTURE, FailureClass.USER, FailureClass.UNKNOWN
_C = Category
_GPU, _HW, _OWN, _COMM, _LAUNCHER, _SRUN, _NOTHING = 6, 5, 4, 3, 2, 1, 0
CATEGORIES: MappingProxyType[Category, CategoryInfo] = MappingProxyType(
    {
        _C.XID: CategoryInfo(_H, True, _GPU),
        _C.GPU_FELL_OFF_BUS: CategoryInfo(_H, True, _GPU),
        _C.CUDA_ECC: CategoryInfo(_H, True, _HW),
        _C.NETWORK_IB_ERROR: CategoryInfo(_H, True, _HW),
        _C.SLURM_NODE_FAILURE: CategoryInfo(_H, True, _HW),
        _C.CUDA_ILLEGAL_ADDRESS: CategoryInfo(_X, True, _OWN),
        _C.CUDA_LAUNCH_FAILURE: CategoryInfo(_H, True, _OWN),
        _C.CUDA_DEVICE_ASSERT: CategoryInfo(_U, False, _OWN),
        _C.CUDA_UNKNOWN_ERROR: CategoryInfo(_H, True, _OWN),
        _C.CUDA_INIT_FAILURE: CategoryInfo(_I, True, _OWN),
        _C.CUDA_OOM: CategoryInfo(_U, False, _OWN),
        _C.HOST_OOM: CategoryInfo(_U, False, _OWN),
        _C.SEGFAULT: CategoryInfo(_X, True, _OWN),
        _C.BUS_ERROR: CategoryInfo(_I, True, _OWN),
        _C.DATALOADER_KILLED: CategoryInfo(_I, True, _OWN),
        _C.USER_EXCEPTION: CategoryInfo(_U, False, _OWN),
        _C.CHECKPOINT_IO_ERROR: CategoryInfo(_I, False, _OWN),
        _C.NAN_LOSS: CategoryInfo(_U, False, _OWN),
        _C.SLURM_TIME_LIMIT: CategoryInfo(_U, True, _OWN),
        _C.SLURM_PREEMPTION: CategoryInfo(_I, True, _OWN),
        _C.NCCL_TIMEOUT: CategoryInfo(_I, True, _COMM),
        _C.NCCL_ERROR: CategoryInfo(_I, True, _COMM),
        _C.GLOO_ERROR: CategoryInfo(_I, True, _COMM),
        _C.ELASTIC_CHILD_FAILED: CategoryInfo(_X, True, _LAUNCHER),
        _C.SLURM_TASK_EXIT: CategoryInfo(_X, True, _SRUN),
        _C.NONE: CategoryInfo(None, None, _NOTHING),
    }
)


@dataclass(frozen=True, slots=True)
class Signature:
    """One row of the table (see the module docstring for what each field means)."""

    id: str
    category: Category
    pattern: re.Pattern[str]
    kind: FindingKind
    role: Role
    priority: int
    failure_class: FailureClass | None
    restartable: bool | None
    signal: int | None = None
    """The signal every match implies, when the regex has no ``signal`` group."""
    node_fallback: bool = True
    weak: bool = False
    by_signal: bool = False
    xid_catalog: bool = False
    hints: tuple[str, ...] = ()
    """Lower-case fragments one of which every match contains: a cheap test that skips the regex on most lines
    (``tests/unit/logs/test_signatures.py`` proves it for every row from the regex itself). Empty: always try."""

    @property
    def name(self) -> str:
        """The row's id (the live detector's historical name for it)."""
        return self.id

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields this row extracts itself (its regex's named groups)."""
        return tuple(self.pattern.groupindex)


def row(
    id: str,
    category: Category,
    kind: FindingKind,
    role: Role,
    priority: int,
    regex: str,
    *,
    flags: int = 0,
    signal: int | None = None,
    node_fallback: bool = True,
    weak: bool = False,
    by_signal: bool = False,
    xid_catalog: bool = False,
    hints: tuple[str, ...] = (),
) -> Signature:
    info = CATEGORIES[category]
    return Signature(
        id,
        category,
        re.compile(regex, flags),
        kind,
        role,
        priority,
        info.failure_class,
        info.restartable,
        signal,
        node_fallback,
        weak,
        by_signal,
        xid_catalog,
        hints,
    )


class Prepared(NamedTuple):
    """A line with its prefixes peeled off, and what they said."""

    body: str
    rank: int | None
    host: str | None
    gpu: str | None


class SignatureMatch(NamedTuple):
    """The row that won a line, with what the line itself decides (an XID's category, a signal's)."""

    signature: Signature
    groups: dict[str, str]
    category: Category
    role: Role
    failure_class: FailureClass | None
    restartable: bool | None
    detail: str
    """Why, when the table alone does not say: the XID catalog's meaning and recommended action."""
