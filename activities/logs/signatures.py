"""The failure-signature library: one table of rows, each a regex that says what a matching log line means.

``SIGNATURES`` is the only place where log text is interpreted; ``activities.logs.crash`` (the live detector's
findings) and ``activities.logs.diagnose`` (root cause over whole logs) both read it. A row says:

* ``category``: the canonical failure category (``Category``), whose ``CATEGORIES`` entry gives the default
  ``failure_class``, ``restartable`` (can a restart, elsewhere, help?) and ``tier`` (how strongly it explains a
  failure: hardware evidence > a rank's own error > a communication error > a launcher's summary);
* ``kind`` and ``role``: what the live detector has always reported (``FindingKind``, in ``workflows.domain.findings``;
  culprit, victim or info);
* ``priority``: when several rows match one line, the highest wins (the table is kept in that order);
* ``pattern``: searched in the line's body, i.e. after the prefixes ``prepare`` peels off. Its named groups are
  the fields it extracts: ``rank`` or ``ranks`` (a Slurm task list), ``host``, ``gpu`` (index or PCI id),
  ``peer_rank``, ``xid``, ``exit_code``, ``signal`` (a number or a name), ``exception``, ``message``, ``at``;
* flags: ``weak`` (a catch-all: any specific row of the same tier beats it), ``by_signal`` (an exit status
  that names SIGSEGV/SIGBUS is filed under that signal's category), ``xid_catalog`` (category, role and
  restartability come from the XID catalog), ``node_fallback`` (whether a host named by the line's prefix may be
  blamed; a ``slurmstepd`` on a survivor may not).

Patterns match the stable core of a message, never one report's wording around it, and tolerate what launchers
put in front of a line: srun labels (``0: ``), ``[rank3]:``/``[default3]:``, timestamps, OpenMPI's
``[1,3]<stderr>:``, Ray's ``(pid=1, ip=...)``, pdsh's ``host: ``, NCCL's ``host:pid:tid [gpu] NCCL WARN``, syslog's
``date host kernel:``. Lines that are only chatter (``NCCL INFO``, missing optional NCCL plugins) never match.

The XID catalogue (``xid_catalog.tsv`` beside this module: NVIDIA's catalogue with NVSentinel's actions and a
recommended action per XID) is read on first use through ``activities.gpu.xid_catalog``, its one loader: an XID
the catalogue calls informational (43, 63, ...) is context, 79 is ``gpu_fell_off_bus``, any other is ``xid``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from activities.logs.tail import rank_token, split_prefix
from workflows.domain.findings import FindingKind
from workflows.domain.incident import FailureClass

__all__ = [
    "CATEGORIES",
    "SIGNATURES",
    "Category",
    "CategoryInfo",
    "Fields",
    "Prepared",
    "Role",
    "Signature",
    "SignatureMatch",
    "extract",
    "match",
    "prepare",
    "signal_number",
]


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


def _row(
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


_K = FindingKind
_CU, _VI, _IN = Role.CULPRIT, Role.VICTIM, Role.INFO
# srun (salloc, sbatch and forks such as Tianhe's yhrun print the same) reports each task's end on its own stderr:
# "srun: error: n1: tasks 0-1: Killed".
_CLIENT = r"^(?:srun|salloc|sbatch|yhrun): "
_CLIENT_HINTS = ("srun: ", "salloc: ", "sbatch: ", "yhrun: ")
_SRUN_TASK = _CLIENT + r"error: (?P<host>[\w.\-]+): tasks? (?P<ranks>\d+(?:[-,]\d+)*): "
# slurmstepd's "*** JOB 5 ON n1 CANCELLED AT ... ***": n1 is where this stepd runs. For a time limit or a preemption
# that is where the job ran; for a node failure it is a survivor (_STEPD_ANY does not take it).
_STEPD_ANY = r"\*\*\* (?:JOB|STEP) [\w.+]+ ON [\w.\-]+ CANCELLED AT (?P<at>\S+)"
_STEPD = r"\*\*\* (?:JOB|STEP) [\w.+]+ ON (?P<host>[\w.\-]+) CANCELLED AT (?P<at>\S+)"
_EXC = r"(?P<exception>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"
_PCI = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_NOT_A_HINT = r"(?<!Search for `)"  # torch's "Search for `cudaErrorX' in <docs>" names an error, it is not one
_USER_TYPES = (
    "ValueError|KeyError|TypeError|AttributeError|IndexError|NameError|AssertionError|FileNotFoundError"
    "|ImportError|ModuleNotFoundError|NotImplementedError|ZeroDivisionError|UnboundLocalError|RecursionError"
    "|SyntaxError|IndentationError|LookupError|JSONDecodeError|UnicodeDecodeError|UnicodeEncodeError"
    "|OverflowError|IsADirectoryError|NotADirectoryError|FileExistsError|PermissionError|ConfigAttributeError"
    "|ConfigKeyError|MisconfigurationException|ValidationError|HFValidationError|RepositoryNotFoundError"
)
_SACCT = r"^\s*\d+(?:_\d+)?(?:\.\w+)?\s.*\s"  # a sacct row: JobID ... State ExitCode

# One row a line or three: the table reads as a table, so the formatter leaves it alone.
# fmt: off
_ROWS: tuple[Signature, ...] = (
    # --- srun's verdict on each task: rank and node are certain ---
    _row("srun_task_oom", _C.HOST_OOM, _K.KILLED, _CU, 100, _SRUN_TASK + r"Out Of Memory", signal=9,
         hints=_CLIENT_HINTS),
    _row("srun_task_segfault", _C.SEGFAULT, _K.SEGFAULT, _CU, 100, _SRUN_TASK + r"(?P<signal>Segmentation fault)",
         hints=_CLIENT_HINTS),
    _row("srun_task_bus_error", _C.BUS_ERROR, _K.SEGFAULT, _CU, 100, _SRUN_TASK + r"(?P<signal>Bus error)",
         hints=_CLIENT_HINTS),
    _row("srun_task_killed", _C.SLURM_TASK_EXIT, _K.KILLED, _CU, 100, _SRUN_TASK + r"Killed", signal=9,
         hints=_CLIENT_HINTS),
    _row("srun_task_signal", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 100,
         _SRUN_TASK + r"(?P<signal>Aborted|Floating point exception|Illegal instruction)", hints=_CLIENT_HINTS),
    # srun stops the remaining tasks after one failed (or on cancel/requeue): they are not the cause.
    _row("srun_task_terminated", _C.SLURM_TASK_EXIT, _K.TERMINATED, _VI, 100, _SRUN_TASK + r"Terminated", signal=15,
         hints=_CLIENT_HINTS),
    _row("srun_task_exit", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         _SRUN_TASK + r"Exited with exit code (?P<exit_code>\d+)", by_signal=True, hints=_CLIENT_HINTS),
    # srun's status listing after the first task ended ("srun: StepId=5.0 task 1: exited abnormally").
    _row("srun_task_abnormal", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         _CLIENT + r"(?:StepId=\S+ )?tasks? (?P<ranks>\d+(?:[-,]\d+)*): exited abnormally", hints=_CLIENT_HINTS),
    # slurmstepd's own account of a task's end (slurmd's log at verbose level, or the step's stderr): "task 3 (4321)
    # exited with exit code 1.", "task 3 (4321) exited. Killed by signal 9.", and a task plugin's "Terminating job
    # step 5.0; task 0 exit code 1 exited without notification" (the task died without telling the step; code 0 there
    # is still a failure: it was signaled or aborted).
    _row("stepd_task_exit", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         r"\btask (?P<rank>\d+) (?:\(\d+\) exited with exit code (?=[1-9])"
         r"|exit code (?=\d+ (?:exited|signaled|aborted) without notification))(?P<exit_code>\d+)", by_signal=True,
         hints=("exit code",)),
    _row("stepd_task_signal", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 100,
         r"\btask (?P<rank>\d+) \(\d+\) exited\. Killed by signal (?P<signal>\d+)", by_signal=True,
         hints=("killed by signal",)),
    # --- lost nodes ---
    _row("srun_node_failure", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _CLIENT + r"error: Node failure on (?P<host>[\w.\-]+)", hints=_CLIENT_HINTS),
    _row("srun_launch_failed", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _CLIENT + r"error: Task launch for \S+ failed on node (?P<host>[\w.\-]+)", hints=_CLIENT_HINTS),
    # The "ON <node>" of a stepd line is where that stepd runs, typically a survivor: never blame it.
    _row("stepd_node_failure", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _STEPD_ANY + r" DUE TO NODE (?:[\w.\-]+ )?FAIL", node_fallback=False, hints=("cancelled at",)),
    # --- Slurm ending the job on purpose: the reason, not a crash of the job's own ---
    _row("stepd_time_limit", _C.SLURM_TIME_LIMIT, _K.CANCELLED, _IN, 100, _STEPD + r" DUE TO (?P<message>TIME LIMIT)",
         hints=("cancelled at",)),
    _row("stepd_preempted", _C.SLURM_PREEMPTION, _K.REQUEUE, _IN, 100, _STEPD + r" DUE TO (?P<message>PREEMPTION)",
         hints=("cancelled at",)),
    # srun --kill-on-bad-exit: a task failed (which one, srun's own lines say).
    _row("stepd_task_failure", _C.SLURM_TASK_EXIT, _K.CANCELLED, _IN, 100, _STEPD + r" DUE TO TASK FAILURE",
         hints=("cancelled at",)),
    _row("stepd_requeue", _C.NONE, _K.REQUEUE, _IN, 100, _STEPD + r" DUE TO (?P<message>JOB REQUEUE)",
         hints=("cancelled at",)),
    _row("stepd_cancelled", _C.NONE, _K.CANCELLED, _IN, 99, _STEPD + r"(?: DUE TO (?P<message>[^*]+?))? \*\*\*",
         hints=("cancelled at",)),
    _row("node_fail_state", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 98, r"\bNODE_FAIL\b", node_fallback=False,
         hints=("node_fail",)),
    # scontrol, sacct and Slurm's mail: "JobState=TIMEOUT", "1234  train ... TIMEOUT  0:0", "Ended, ..., TIMEOUT"
    _row("slurm_state_timeout", _C.SLURM_TIME_LIMIT, _K.CANCELLED, _IN, 98,
         r"\b(?:Job)?State[=:] ?TIMEOUT\b|Ended, Run time \S+, TIMEOUT\b|" + _SACCT + r"TIMEOUT\s+\d+:\d+\s*$",
         hints=("timeout",)),
    _row("slurm_state_preempted", _C.SLURM_PREEMPTION, _K.REQUEUE, _IN, 98,
         r"\b(?:Job)?State[=:] ?PREEMPTED\b|Ended, Run time \S+, PREEMPTED\b|" + _SACCT + r"PREEMPTED\s+\d+:\d+\s*$",
         hints=("preempted",)),
    # --- GPU and fabric hardware ---
    _row("nvrm_xid", _C.XID, _K.XID, _CU, 95, rf"NVRM: Xid \((?:PCI:)?(?P<gpu>{_PCI})?[^)]*\): (?P<xid>\d+)\b",
         xid_catalog=True, hints=("nvrm: xid",)),
    # The driver's and NVML's names for it too: NV_ERR_GPU_IS_LOST, whose text is "GPU lost from the bus" (NVRM's
    # failed RPCs, "Check failed: ..."), and NVML_ERROR_GPU_IS_LOST ("GPU is lost").
    _row("gpu_fell_off_bus", _C.GPU_FELL_OFF_BUS, _K.CUDA_ERROR, _CU, 95,
         r"fallen off the bus|\bGPU is lost\b|\bGPU lost from the bus\b|\bNV(?:ML)?_ERR(?:OR)?_GPU_IS_LOST\b"
         rf"|Unable to determine the device handle for GPU ?(?P<gpu>{_PCI})",
         hints=("fallen off the bus", "gpu is lost", "gpu lost from the bus", "_gpu_is_lost",
             "unable to determine the device handle")),
    _row("cuda_ecc", _C.CUDA_ECC, _K.CUDA_ERROR, _CU, 94,
         _NOT_A_HINT + r"cudaErrorECCUncorrectable|(?i:uncorrectable ECC error)|(?i:double[- ]bit ECC)",
         hints=("eccuncorrectable", "uncorrectable ecc", "bit ecc")),
    # A work request that completed in error. ibverbs says "transport retry counter exceeded" / "RNR retry counter
    # exceeded"; UCX says "Transport retry count exceeded" / "Receive-no-ready retry count exceeded" and prints the
    # CQE's syndrome, "(synd 0x15 vend 0x81 ...)", only for a completion with error (flushes are traced, not logged).
    _row("ib_completion_error", _C.NETWORK_IB_ERROR, _K.COMM_ERROR, _VI, 93,
         r"NET/IB\w*\s*:\s*Got completion|IBV_WC_\w+_ERR|local catastrophic error"
         r"|(?i:(?:transport|RNR|receive-no-ready) retry count(?:er)? exceeded)|\(synd 0x[0-9a-f]+ vend 0x[0-9a-f]+",
         hints=("got completion", "ibv_wc_", "retry count", "catastrophic", "(synd 0x")),
    _row("ib_error", _C.NETWORK_IB_ERROR, _K.COMM_ERROR, _VI, 93,
         r"NET/IB\w*\s*:.*(?:[Ee]rror|[Ff]ail)|\bibv_\w+(?:\(\))? failed|\bibv_poll_cq\b.*(?:[Ee]rror|[Ff]ail)"
         r"|\bmlx5\w*\b.*(?i:error|fail|catastroph|unrecoverable|compromised|link down|port down|cable unplugged)"
         r"|\bib\w*: .*port \d+ .*state (?:changed to )?(?i:down)", hints=("net/ib", "ibv_", "mlx5", "state ")),
    # dmesg, DCGM or a node agent naming an XID without the NVRM line: "Xid 79", "XID=48"
    _row("xid_mention", _C.XID, _K.XID, _CU, 92,
         r"(?<![\w-])(?:Xid|XID)(?: error| event)?s?\s*+(?:[:=#]\s*+)?(?P<xid>\d{1,3})\b(?![.\d])", xid_catalog=True,
         hints=("xid",)),
    # --- CUDA: before any communication row, so "watchdog terminated with exception: CUDA error: ..." is CUDA ---
    # Out of device memory and device-side asserts (an index out of range in a kernel) are the program's doing.
    # NCCL prints a failed CUDA call as "Cuda failure 'out of memory'" (runtime) or "Cuda failure 2 'out of memory'"
    # (driver, with the CUresult). PyTorch's allocator explains the failed allocation in the rest of its message,
    # which is all that is left when the head was cut off or the message wrapped: "Tried to allocate 20.00 MiB (GPU 0;
    # ... reserved in total by PyTorch)", since 2.1 "GPU 0 has a total capacity of ... of which ... is free ... is
    # reserved by PyTorch but unallocated". XLA and TensorFlow say RESOURCE_EXHAUSTED / "OOM when allocating tensor".
    _row("cuda_oom", _C.CUDA_OOM, _K.CUDA_ERROR, _CU, 90,
         r"CUDA (?:error: )?out of memory|HIP (?:error: )?out of memory|(?:Cuda|HIP) failure (?:\d+ )?'?out of memory"
         r"|[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: out of memory"
         r"|\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b|CUBLAS_STATUS_ALLOC_FAILED|"
         + _NOT_A_HINT + r"cudaErrorMemoryAllocation"
         r"|Tried to allocate [\d.]+ \w+ \(GPU \d+;|\bGPU ?\d* has a total capacity of [\d.]+ \w+ of which"
         r"|reserved in total by PyTorch|is reserved by PyTorch but unallocated"
         r"|RESOURCE_EXHAUSTED: Out of memory while trying to allocate|\bOOM when allocating tensor",
         hints=("out of memory", "outofmemoryerror", "cublas_status_alloc_failed", "cudaerrormemoryallocation",
             "tried to allocate", "has a total capacity", "by pytorch", "oom when allocating")),
    _row("cuda_device_assert", _C.CUDA_DEVICE_ASSERT, _K.CUDA_ERROR, _CU, 90,
         r"device-side assert(?:ion)? triggered|" + _NOT_A_HINT + r"cudaErrorAssert\b"
         r"|\.cuh?:\d+: .*block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion .* failed",
         hints=("device-side assert", "cudaerrorassert", "assertion")),
    _row("cuda_illegal_address", _C.CUDA_ILLEGAL_ADDRESS, _K.CUDA_ERROR, _CU, 89,
         r"(?P<message>an illegal memory access was encountered|misaligned address"
         r"|an illegal instruction was encountered)|"
         + _NOT_A_HINT + r"cudaError(?:IllegalAddress|MisalignedAddress|IllegalInstruction)\b",
         hints=("illegal memory access", "misaligned address", "illegal instruction", "cudaerror")),
    _row("cuda_launch_failure", _C.CUDA_LAUNCH_FAILURE, _K.CUDA_ERROR, _CU, 89,
         r"(?P<message>unspecified launch failure|the launch timed out and was terminated)|"
         + _NOT_A_HINT + r"cudaErrorLaunch(?:Failure|Timeout)\b",
         hints=("unspecified launch failure", "launch timed out", "cudaerrorlaunch")),
    _row("cuda_init_failure", _C.CUDA_INIT_FAILURE, _K.CUDA_ERROR, _CU, 88,
         r"no CUDA-capable device is detected|CUDA driver version is insufficient|Found no NVIDIA driver"
         r"|NVIDIA driver on your system is too old|(?:CUDA error: |Cuda failure (?:\d+ )?')initialization error"
         r"|invalid device ordinal|CUDA driver initialization failed|Unexpected error from cudaGetDeviceCount\(\)"
         r"|No CUDA GPUs are available|CUDA-capable device\(s\) (?:is|are|is/are) busy or unavailable"
         r"|CUDA error: system not yet initialized|CUDA unknown error - this may be due to an incorrectly set up"
         r"|Failed to initialize NVML|Driver/library version mismatch|couldn't communicate with the NVIDIA driver"
         r"|^No devices were found$|RmInitAdapter failed|" + _NOT_A_HINT
         + r"cudaError(?:NoDevice|InsufficientDriver|InitializationError|InvalidDevice|DevicesUnavailable"
         r"|SystemNotReady)\b",
         hints=("cuda-capable", "driver version is insufficient", "no nvidia driver",
             "driver on your system is too old", "initialization error", "invalid device ordinal", "no cuda gpus",
             "cuda driver initialization failed", "from cudagetdevicecount",
             "system not yet initialized", "cuda unknown error", "initialize nvml", "version mismatch",
             "communicate with the nvidia driver", "no devices were found", "rminitadapter", "cudaerror")),
    _row("cuda_unknown_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 87,
         r"[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: unknown error|CUDA_ERROR_UNKNOWN|"
         + _NOT_A_HINT + r"cudaErrorUnknown\b",
         hints=("unknown error", "cuda_error_unknown", "cudaerrorunknown")),
    # NCCL's name for a CUDA call that failed under it (the CUDA error itself, if printed, follows it).
    _row("nccl_unhandled_cuda", _C.NCCL_ERROR, _K.CUDA_ERROR, _CU, 86, r"unhandled cuda error|ncclUnhandledCudaError",
         hints=("unhandled cuda error", "ncclunhandledcudaerror")),
    _row("cuda_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 84,
         r"(?:[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: |Cuda failure ')(?P<message>[^'\n]+)",
         weak=True, hints=("cuda ",)),
    _row("cuda_library_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 83,
         r"\bCUBLAS_STATUS_(?!SUCCESS)\w+|\bCUDNN_STATUS_(?!SUCCESS)\w+|cuDNN error", weak=True,
         hints=("cublas_status_", "cudnn_status_", "cudnn error")),
    # --- the job's own errors, most specific first ---
    # /dev/shm exhausted: the DataLoader's shared memory, not a checkpoint.
    _row("shm_exhausted", _C.BUS_ERROR, _K.KILLED, _CU, 81,
         r"DataLoader worker \(pid(?:\(s\))? [\d, ]+\) is killed by signal: Bus error|unable to write to file </torch_"
         r"|insufficient shared memory \(shm\)|Unexpected bus error encountered in worker", signal=7,
         hints=("dataloader worker", "unable to write to file", "insufficient shared memory", "unexpected bus error")),
    # Keras's and MindSpore's TerminateOnNaN print "Invalid loss, terminating training"; HF's DebugUnderflowOverflow
    # "Detected inf/nan during batch_number=N".
    _row("nan_loss", _C.NAN_LOSS, _K.PYTHON_EXCEPTION, _CU, 80,
         r"[Ff]ound [Nn]a[Nn] in|NaN or Inf found in|[Nn]a[Nn] loss|[Dd]etected (?:inf/)?[Nn]a[Nn]"
         r"|[Ee]ncountered [Nn]a[Nn]"
         r"|returned nan values in its \d+\w* output|is non-finite, so it cannot be clipped|Invalid loss, terminating"
         r"|Minimum loss scale reached|loss scale already at minimum|[Gg]rad[ _]norm\S*\s*[:=]\s*(?:[Nn]a[Nn]|NAN)\b",
         hints=("nan", "non-finite", "loss scale", "invalid loss")),
    # The loss printed or checked as NaN or Inf: training diverged. "loss: nan", "'loss': nan", a named term
    # ("loss_cls: nan"), "Loss is inf", Detectron2's FloatingPointError "Loss became infinite or NaN", MMCV's "loss
    # become infinite or NaN", Lightning's "The loss returned in `training_step` is nan" (or "is tensor(nan, ...)"),
    # Composer's "Train loss contains a NaN".
    _row("loss_not_finite", _C.NAN_LOSS, _K.PYTHON_EXCEPTION, _CU, 80,
         r"[Ll][Oo][Ss][Ss](?:_[A-Za-z0-9]{1,32}+){0,4}+(?![A-Za-z0-9])['\"]?(?: value| returned in `\w+`)?\s*"
         r"(?:is\s|became\s|become\s|went\s|contains\s(?:an?\s)?|=|:)\s*['\"]?(?:tensor\()?"
         r"(?:[Nn]a[Nn]|NAN|-?[Ii]nf(?:inite|inity)?|-?INF)\b", hints=("loss",)),
    _row("checkpoint_io", _C.CHECKPOINT_IO_ERROR, _K.PYTHON_EXCEPTION, _CU, 80,
         r"No space left on device|Disk quota exceeded|PytorchStreamWriter failed|PytorchStreamReader failed"
         r"|failed finding central directory|inline_container\.cc.*(?:unexpected pos|file write failed)"
         r"|unexpected EOF, expected \d+ more bytes|invalid load key|EOFError: Ran out of input|SafetensorError"
         r"|Error while deserializing header|Input/output error|Read-only file system|Stale file handle"
         r"|write\(\): fd \d+ failed|File \S+ cannot be opened|Parent directory \S+ does not exist"
         r"|Permission denied: .*(?i:ckpt|checkpoint|\.pth?\b|\.safetensors|\.bin\b|/save|/output)",
         hints=("no space left", "quota exceeded", "pytorchstream", "central directory", "inline_container",
             "unexpected eof", "invalid load key", "ran out of input", "safetensor", "deserializing header",
             "input/output error", "read-only file system", "stale file handle", "permission denied", "write(): fd",
             "cannot be opened", "parent directory")),
    _row("dataloader_killed", _C.DATALOADER_KILLED, _K.KILLED, _CU, 79,
         r"DataLoader worker \(pid(?:\(s\))? [\d, ]+\) "
         r"(?:is killed by signal: (?P<signal>[\w ]+)|exited unexpectedly)", hints=("dataloader worker",)),
    # Host OOM: the kernel's or the cgroup's killer, or an allocation the host could not serve.
    _row("oom_kill", _C.HOST_OOM, _K.KILLED, _CU, 78,
         r"(?i:\boom[-_ ]kill)|Out of memory: Killed process|(?i:memory cgroup out of memory)|OOM Killed"
         r"|\bOOMKilled\b|Out Of Memory|\bOUT_OF_ME(?:MORY|\+)|\bKilled process \d+ \("
         r"|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|^(?:builtins\.)?MemoryError\b"
         r"|\[Errno 12\] Cannot allocate memory", signal=9,
         hints=("oom", "out of memory", "out_of_me", "killed process", "defaultcpuallocator", "memoryerror",
             "cannot allocate memory")),
    # --- death by signal, as printed by faulthandler, the shell, torchrun, UCX or MPI ---
    _row("segfault", _C.SEGFAULT, _K.SEGFAULT, _CU, 77,
         r"Segmentation fault|\bSIGSEGV\b|\b[Ss]ignal:? 11\b|Caught signal 11\b", signal=11,
         hints=("segmentation fault", "sigsegv", "ignal")),
    _row("bus_error", _C.BUS_ERROR, _K.SEGFAULT, _CU, 77, r"\bBus error\b|\bSIGBUS\b|\b[Ss]ignal:? 7\b", signal=7,
         hints=("bus error", "sigbus", "ignal")),
    # Shapes, devices, dtypes, state dicts, autograd misuse: the code is wrong, whatever exception carries it.
    _row("user_runtime_error", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 76,
         r"size mismatch|mat1 and mat2 shapes cannot be multiplied|The size of tensor a \(\d+\) must match"
         r"|shape '\[[^\]]*\]' is invalid for input of size|Expected all tensors to be on the same device"
         r"|Error\(s\) in loading state_dict|(?:Unexpected|Missing) key\(s\) in state_dict"
         r"|expected scalar type \w+ but found \w+|Expected (?:input|target) batch_size|Given groups=\d+, weight of"
         r"|does not require grad and does not have a grad_fn|backward through the graph a second time"
         r"|modified by an inplace operation|Expected to have finished reduction in the prior iteration"
         r"|Default process group has not been initialized|Input type \(\S+\) and weight type \(\S+\) should be"
         r"|[Ss]izes of tensors must match|stack expects each tensor to be equal size|index out of range in self"
         r"|Target -?\d+ is out of bounds|Detected mismatch between collectives",
         hints=("size mismatch", "shapes cannot be multiplied", "the size of tensor a",
             "is invalid for input of size", "on the same device", "in loading state_dict", "key(s) in state_dict",
             "expected scalar type", "batch_size", "given groups=", "does not require grad", "a second time",
             "inplace operation", "finished reduction", "has not been initialized", "weight type",
             "izes of tensors must match", "equal size", "index out of range in self", "is out of bounds",
             "mismatch between collectives")),
    # A message that starts on the next line ("AssertionError:" alone: torch's own driver check raised one that way,
    # "\nFound no NVIDIA driver on your system ...") is read there; the bare line is left to the weak catch-all.
    _row("python_exception", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 75,
         rf"^(?P<exception>(?:[A-Za-z_]\w*\.)*(?:{_USER_TYPES}))(?::\s*(?P<message>\S.*))?$",
         hints=("error", "exception")),
    _row("abort", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 70,
         r"Fatal Python error: Aborted|\bSIGABRT\b|\b[Ss]ignal:? 6\b", signal=6,
         hints=("aborted", "sigabrt", "ignal")),
    # --- communication: this rank lost a peer or timed out waiting; the class is the peer's ---
    _row("nccl_watchdog_timeout", _C.NCCL_TIMEOUT, _K.COMM_ERROR, _VI, 65,
         r"Watchdog caught collective operation timeout|collective operation timeout|Timeout at NCCL work"
         r"|Some NCCL operations have failed or timed out|NCCL (?:operation|collective|communicator) timed out"
         r"|Received a dump signal due to a collective timeout|NCCL timeout",
         hints=("collective operation timeout", "timeout at nccl work", "nccl operations have failed", "timed out",
             "dump signal", "nccl timeout")),
    _row("nccl_heartbeat", _C.NCCL_TIMEOUT, _K.COMM_ERROR, _VI, 65,
         r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds|no heartbeat of its watchdog"
         r"|no watchdog heartbeat|ProcessGroupNCCL's watchdog",
         hints=("heartbeat", "watchdog got stuck", "processgroupnccl's watchdog")),
    _row("gloo_timeout", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 62,
         r"Timed out waiting \d+ ?ms for (?:recv|send) operation|ProcessGroupGloo\w*::\w+.*(?:timed out|Timeout)"
         r"|Rank (?P<peer_rank>\d+) failed to pass monitoredBarrier",
         hints=("timed out waiting", "processgroupgloo", "monitoredbarrier")),
    _row("nccl_remote_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"ncclRemoteError|remote process exited or there was a network error",
         hints=("ncclremoteerror", "remote process exited")),
    _row("nccl_system_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"unhandled system error|ncclSystemError|ncclInternalError|NCCL error in: \S+ internal error"
         r"|ncclInvalidUsage|ncclInvalidArgument|\binvalid usage \(run with|\binternal error - please report",
         hints=("unhandled system error", "ncclsystemerror", "ncclinternalerror", "internal error", "ncclinvalid",
             "invalid usage")),
    _row("nccl_init_failure", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"ncclCommInit\w* failed|Failed to initialize NCCL|Duplicate GPU detected"
         r"|\[(?P<rank>\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[(?P<peer_rank>\d+)\]"
         r"|NCCL WARN .*(?:Connect to \S+ failed|[Bb]ootstrap.*(?:failed|[Tt]imeout|[Ee]rror))",
         hints=("ncclcomminit", "failed to initialize nccl", "duplicate gpu", "nccluniqueid", "nccl warn")),
    # A peer's socket closed under gloo (or a plain Python socket); NCCL's lines have their own rows.
    # A retried HTTP request's "Connection reset by peer" warning is not a collective's.
    _row("peer_lost", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 59,
         r"^(?!.*(?:NCCL|[Rr]etry|[Rr]etrying|WARNING)).*?Connection (?:closed|reset) by peer",
         hints=("by peer",)),
    _row("nccl_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 58,
         r"\bNCCL error\b|\bNCCL Error \d|NCCL WARN .*(?:[Ee]rror|[Ff]ail|[Cc]losed|[Rr]eset)|\bnccl[A-Z]\w*Error\b",
         hints=("nccl",)),
    _row("gloo_error", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 57,
         r"\[enforce fail at [^\]]*gloo[^\]]*\]|gloo/transport/\S+\]|Gloo connectFullMesh failed"
         r"|ProcessGroupGloo\w*::\w+.*(?:failed|[Ee]rror)|\bgloo\b.*(?:[Ee]rror|failed)", hints=("gloo",)),
    _row("nccl_aborted", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 55,
         r"NCCL communicator was aborted|[Cc]ommunicator was aborted|ncclCommAbort",
         hints=("was aborted", "ncclcommabort")),
    # The c10d store and rendezvous: a communicator that could not be set up.
    _row("c10d_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 52,
         r"\bDistNetworkError\b|\bDistStoreError\b|client socket has timed out|server socket has failed"
         r"|\bSocket Timeout\b|TCPStore\w*.*(?:failed|timed out|[Ee]rror)|\bRendezvous\w*(?:Error|Exception)\b",
         hints=("distnetworkerror", "diststoreerror", "socket", "tcpstore", "rendezvous")),
    _row("dist_backend_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 50, r"\bDistBackendError\b", weak=True,
         hints=("distbackenderror",)),
    # --- launchers' summaries: a child failed; the cause is elsewhere in the log, if anywhere ---
    _row("torchrun_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"\bfailed \(exitcode: (?P<exit_code>-?\d+)\)", by_signal=True, hints=("failed (exitcode",)),
    _row("launcher_exit", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"exits with return code = (?P<exit_code>-?[1-9]\d*)", by_signal=True, hints=("exits with return code",)),
    _row("subprocess_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"CalledProcessError: Command .*(?:returned non-zero exit status (?P<exit_code>-?\d+)"
         r"|died with <Signals\.SIG\w+: (?P<signal>\d+)>)", by_signal=True, hints=("calledprocesserror",)),
    # torchrun's summary block; diagnose reads the rank, host and exit code on the lines after its header.
    _row("elastic_root_cause", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 39,
         r"Root Cause \(first observed failure\)", hints=("root cause",)),
    _row("elastic_exitcode", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 38,
         r"^\s*exitcode\s*: (?P<exit_code>-?\d+)", by_signal=True, hints=("exitcode",)),
    _row("torchrun_child_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 38, r"\bChildFailedError\b",
         hints=("childfailederror",)),
    _row("signal_received", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 37,
         r"\bSignal (?P<signal>\d+) \(SIG\w+\) received by PID", by_signal=True, hints=("received by pid",)),
    # The shell's job-control line: "slurm_script: line 12:  4321 Killed   python train.py"
    _row("shell_killed", _C.SLURM_TASK_EXIT, _K.KILLED, _CU, 36,
         r"^(?:\S+: line \d+: +\d+ +)?Killed(?:\s|$)", signal=9, hints=("killed",)),
    # A trainer announcing its own exit (the demo: "fatal error (...): exiting with code 13").
    _row("exit_code", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 35,
         r"(?:\bexit(?:ing|ed)?\b[^\n]{0,40}?|\bterminated|\bfinished) with (?:exit )?(?:code|status):? "
         r"(?P<exit_code>-?[1-9]\d*)", flags=re.IGNORECASE,
         by_signal=True, hints=("exit", "terminated with", "finished with")),
    # --- the last line of any other traceback: most likely the program's own error ---
    _row("python_exception_other", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 20,
         r"^" + _EXC + r"(?::\s*(?P<message>.*))?$", weak=True, hints=("error", "exception")),
)
# fmt: on

SIGNATURES: tuple[Signature, ...] = tuple(sorted(_ROWS, key=lambda s: -s.priority))
"""The table, highest priority first (rows of equal priority in the order written)."""

# Chatter that mentions errors without being one: NCCL's INFO trace, optional plugins that are absent.
_BENIGN = re.compile(
    r"\bNCCL INFO\b|Failed to open libibverbs|NET/Plugin\b|No plugin found|Could not find: libnccl-net"
    r"|Could not find real path"
)
_SIGNAL_CATEGORY = {11: Category.SEGFAULT, 7: Category.BUS_ERROR}
_SIGNALS = {
    "Segmentation fault": 11,
    "Bus error": 7,
    "Killed": 9,
    "Aborted": 6,
    "Floating point exception": 8,
    "Illegal instruction": 4,
    "Terminated": 15,
}
_MAX_TASKS = 4096

# ----- prefixes -------------------------------------------------------------------------------------------------

# OpenMPI's --tag-output, Ray's worker prefix, pdsh/mpirun's "host: " (a name with a digit, so "RuntimeError: "
# is never taken for one).
_EXTRA_PREFIX = re.compile(
    r"[:|]\s+"  # what is left of "2024-05-01T10:00:00Z: " or "... | " once the timestamp is gone
    r"|(?:[A-Z][a-z]{2} ){1,2} ?\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d{4})? +"  # syslog, ctime: "Jul 13 21:22:34 "
    r"|\[(?:\s*\d+\.\d+|[A-Z][a-z]{2} [A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4})\]\s*"  # dmesg, dmesg -T
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?"
    r"|\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s+"
    r"|\[(?P<ucx>[\w.\-]+):\d+\s*:\d+:\d+\]\s*"  # UCX/MPI: "[host:pid :thread:tid] Caught signal 11"
    # A host name with a digit before its first dot; possessive, so a long run of name characters not followed by
    # ": " fails in linear time (the plain form backtracked quadratically).
    r"|(?P<host>(?!rank\d)[A-Za-z](?=[A-Za-z0-9\-]*\d)[A-Za-z0-9.\-]*+|\d{1,3}(?:\.\d{1,3}){3}): (?=\S)"
)
_NCCL_PREFIX = re.compile(r"^(?P<host>[\w.\-]+):\d+:\d+ \[(?P<gpu>\d+)\]")
_SYSLOG_HOST = re.compile(
    r"^(?:[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d )?(?P<host>[\w.\-]+) (?:kernel|slurmd|slurmstepd)(?:\[\d+\])?: "
)
_NODE_IN_LINE = re.compile(r"(?<![\w.])node=(?P<host>[\w.\-]+)")
_LEADING_EXC = re.compile(r"^" + _EXC + r":\s*")
# What a message names in its own words ("GPU 0 has a total capacity", "Rank 11: found NaN ... node: n7"), read
# for a matched line when neither the row's groups nor the prefixes gave it.
_HINTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "gpu",
        re.compile(
            r"\(GPU (\d+);|\bGPU (\d+) has a total capac|\bDevice:? (\d+)\b|\bCUDA device (\d+)\b|device ordinal (\d+)"
        ),
    ),
    ("pci", re.compile(rf"(?<![\w:])({_PCI})(?![\w:])")),
    ("host", re.compile(r"\bnode: ([\w\-]+(?:\.[\w\-]+)*)|\bon host ([\w.\-]+)|\bhostname[=:] ?([\w.\-]+)")),
    ("exit_code", re.compile(r"\bexit ?code:? (-?\d+)|\bexit status (-?\d+)|return code = (-?\d+)")),
    ("rank", re.compile(r"\bRank (\d+)\]|\bRank (\d+): |\bon rank (\d+)\b|\bglobal rank (\d+)\b")),
)


class Prepared(NamedTuple):
    """A line with its prefixes peeled off, and what they said."""

    body: str
    rank: int | None
    host: str | None
    gpu: str | None


def prepare(text: str) -> Prepared:
    """Peel launcher, rank and time prefixes off ``text``; keep the rank, host and GPU they name.

    Args:
        text: One log line as written.

    Returns:
        The body the rows are matched against, and the rank (srun label, ``[rankN]:``, OpenMPI tag), host (pdsh
        prefix, ``slurmstepd-<node>:``, NCCL's ``host:pid:tid``) and GPU (NCCL's ``[dev]``) its prefixes name,
        each None when they name none. What the body names itself is read by ``extract``, for matched lines only.
    """
    prefix = split_prefix(text, parse_time=False)
    body = prefix.body
    rank = prefix.label if prefix.label is not None else prefix.torch_rank
    host: str | None = None
    gpu: str | None = None
    for _ in range(6):  # prefixes nest: "2024-...Z: [1,12]<stdout>:host:pid:tid [0] NCCL WARN ...", two timestamps
        again = split_prefix(body, parse_time=False)
        if again.body != body:
            body = again.body
            if rank is None:
                rank = again.label if again.label is not None else again.torch_rank
            continue
        m = _EXTRA_PREFIX.match(body)
        if m is None:
            break
        if m.group("mpi") is not None and rank is None:
            rank = int(m.group("mpi"))
        if m.group("host") is not None or m.group("ucx") is not None:
            host = (m.group("host") or m.group("ucx")).removeprefix("slurmstepd-")
        body = body[m.end() :]
    m = _NCCL_PREFIX.match(body)
    if m is not None:
        host, gpu = m.group("host"), m.group("gpu")
    return Prepared(body, rank, host, gpu)


# ----- matching -------------------------------------------------------------------------------------------------


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


def match(body: str) -> SignatureMatch | None:
    """The highest-priority row whose pattern is found in ``body`` (see ``prepare``), or None."""
    low = body.lower()
    hits = [rows for hint, rows in _HINTS_OF_ROWS if hint in low]
    if not hits and not _ALWAYS_TRIED:
        return None  # most lines: no row could match
    if _BENIGN.search(body):
        return None
    candidates = set(_ALWAYS_TRIED).union(*hits)
    for i in sorted(candidates):
        sig = SIGNATURES[i]
        m = sig.pattern.search(body)
        if m is not None:
            return _resolve(sig, {k: v for k, v in m.groupdict().items() if v is not None})
    return None


def _index_hints() -> tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[int, ...]]:
    rows: dict[str, list[int]] = {}
    for i, sig in enumerate(SIGNATURES):
        for hint in sig.hints:
            rows.setdefault(hint, []).append(i)
    return tuple((h, tuple(v)) for h, v in rows.items()), tuple(i for i, sig in enumerate(SIGNATURES) if not sig.hints)


# Each distinct hint is looked for once per line (about 160 substring tests, a few microseconds), whichever rows
# share it; only the rows whose hints are present run their regex.
_HINTS_OF_ROWS, _ALWAYS_TRIED = _index_hints()


def _resolve(sig: Signature, groups: dict[str, str]) -> SignatureMatch:
    category, role, detail = sig.category, sig.role, ""
    if sig.xid_catalog and "xid" in groups:
        # The catalogue is read on first use, by its one loader (the GPU health verdict reads it too).
        from activities.gpu.xid_catalog import default_xid_catalog

        xid = int(groups["xid"])
        entry = default_xid_catalog().get(xid)
        if entry is None:
            detail = f"XID {xid}: not in the catalogue"
        else:
            action = entry.recommended_action or entry.action
            detail = f"XID {xid} {entry.mnemonic}: {entry.meaning}; recommended: {action}"
            if action.startswith("None (informational)") or action == "IGNORE":
                category, role = Category.NONE, Role.INFO  # e.g. 43, 63: context, not a failure of its own
            elif "FALLEN_OFF_THE_BUS" in entry.mnemonic:
                category = Category.GPU_FELL_OFF_BUS
            elif entry.action == "RESTART_APP":
                # NVIDIA's bucket for XIDs that need no node action (13, 31, ...): as often the application's
                # fault as the GPU's, so the class is not hardware.
                return SignatureMatch(sig, groups, category, role, FailureClass.UNKNOWN, True, detail)
    if sig.by_signal:
        signal = _signal_of(groups)
        category = _SIGNAL_CATEGORY.get(signal, category) if signal is not None else category
    if category is sig.category:
        return SignatureMatch(sig, groups, category, role, sig.failure_class, sig.restartable, detail)
    info_c = CATEGORIES[category]
    return SignatureMatch(sig, groups, category, role, info_c.failure_class, info_c.restartable, detail)


def _signal_of(groups: dict[str, str]) -> int | None:
    """The signal an exit status names: ``-11`` (Python, torchrun) or ``139`` (a shell: 128 + 11)."""
    if "signal" in groups:
        return signal_number(groups["signal"])
    if "exit_code" in groups:
        code = int(groups["exit_code"])
        if code < 0:
            return -code
        if 128 < code < 160:
            return code - 128
    return None


def signal_number(text: str) -> int | None:
    """``11`` or ``Segmentation fault`` -> 11; None for a name that is not a signal's."""
    text = text.strip()
    return int(text) if text.isdigit() else _SIGNALS.get(text)


# ----- fields ---------------------------------------------------------------------------------------------------


class Fields(NamedTuple):
    """What one matched line implicates; None where it says nothing."""

    ranks: tuple[int, ...] | None
    """From a Slurm task list (``tasks 0,2-3``); None without one, ``()`` when the list is implausible."""
    rank: int | None
    host: str | None
    gpu: str | None
    peer_rank: int | None
    xid: int | None
    exit_code: int | None
    signal: int | None
    exception: str | None
    message: str


def extract(hit: SignatureMatch, prep: Prepared, *, rank: int | None = None, host: str | None = None) -> Fields:
    """The fields of a matched line: the row's groups first, then the line's prefixes.

    Args:
        hit: What ``match`` returned for ``prep.body``.
        prep: The prepared line.
        rank: The rank the reader already knows for the line (e.g. from its file name), preferred to the
            prefixes' one.
        host: The host the reader already knows (e.g. ``%N`` in a file pattern), preferred to the prefixes'.
    """
    g, body, sig = hit.groups, prep.body, hit.signature
    exception, message = g.get("exception"), g.get("message")
    leading = _LEADING_EXC.match(body)
    if exception is None and leading is not None:
        exception = leading.group("exception")
    if message is None and leading is not None:
        message = body[leading.end() :]
    elif message is None:
        # A bare "AssertionError" has no message; any other line is its own message.
        message = "" if "exception" in g else body
    node = g.get("host")
    if node is None and sig.node_fallback:
        node = host or prep.host
    exit_code = int(g["exit_code"]) if "exit_code" in g else None
    signal = signal_number(g["signal"]) if "signal" in g else None
    if signal is None:
        signal = sig.signal
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code  # torchrun and Python's subprocess report death by signal N as -N
    line_rank = rank if rank is not None else prep.rank
    if exit_code is None:
        exit_code = _int(_hints(body).get("exit_code"))
    if line_rank is None:
        line_rank = rank_token(body)
    if node is None and sig.node_fallback:
        m = _SYSLOG_HOST.match(body) or _NODE_IN_LINE.search(body)
        node = m.group("host") if m is not None else None
    gpu = g.get("gpu") or prep.gpu
    if gpu is None or line_rank is None or (node is None and sig.node_fallback):
        hints = _hints(body)
        gpu = gpu or hints.get("gpu")
        if sig.kind in (FindingKind.CUDA_ERROR, FindingKind.XID):  # a NIC's or a disk's PCI id is not a GPU
            gpu = gpu or hints.get("pci")
        line_rank = line_rank if line_rank is not None else _int(hints.get("rank"))
        node = node if node is not None or not sig.node_fallback else hints.get("host")
    ranks = _task_list(g["ranks"]) if "ranks" in g else None
    if ranks:
        line_rank = ranks[0]  # srun names the task: the rank is certain
    return Fields(
        ranks=ranks,
        rank=int(g["rank"]) if "rank" in g else line_rank,
        host=node,
        gpu=gpu,
        peer_rank=int(g["peer_rank"]) if "peer_rank" in g else None,
        xid=int(g["xid"]) if "xid" in g else None,
        exit_code=exit_code,
        signal=signal,
        exception=exception,
        message=message.strip(),
    )


def _hints(body: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, regex in _HINTS:
        if name in found:
            continue
        m = regex.search(body)
        if m is not None:
            found[name] = next(v for v in m.groups() if v is not None)
    return found


def _int(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _task_list(text: str) -> tuple[int, ...]:
    """``0,2-3`` -> ``(0, 2, 3)``; ``()`` when it is malformed or implausibly long."""
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo or (hi == "" and part.endswith("-")):
            return ()
        first, last = int(lo), int(hi or lo)
        if last < first or len(ranks) + last - first >= _MAX_TASKS:
            return ()
        ranks.extend(range(first, last + 1))
    return tuple(ranks)
