"""The failure-signature table: one row a known log line, and nothing else (docs/detection.md says how to add one).

A row (``activities.logs.signature_types.row``) says:

* its id, ``category`` (``Category``), ``kind`` and ``role`` (what the live detector reports: ``FindingKind``;
  culprit, victim or info) and ``priority``: when several rows match one line, the highest wins;
* the regex, searched in the line's body (after the prefixes ``signatures.prepare`` peels off). Its named groups
  are the fields it extracts: ``rank`` or ``ranks`` (a Slurm task list), ``host``, ``gpu`` (index or PCI id),
  ``peer_rank``, ``xid``, ``exit_code``, ``signal`` (a number or a name), ``exception``, ``message``, ``at``,
  ``checkpoint``/``checkpoint_file`` (the checkpoint a load failed on);
* flags: ``weak`` (a catch-all: any specific row of the same tier beats it), ``by_signal`` (an exit status
  that names SIGSEGV/SIGBUS is filed under that signal's category), ``xid_catalog`` (category, role and
  restartability come from the XID catalog), ``node_fallback`` (whether a host named by the line's prefix may be
  blamed; a ``slurmstepd`` on a survivor may not), ``hints`` (lower-case fragments one of which every match
  contains: a cheap test that skips the regex on most lines; ``tests/unit/logs/test_signatures.py`` proves them).

Patterns match the stable core of a message, never one report's wording around it. The fragments below are the
parts several rows share.
"""

from __future__ import annotations

import re

from activities.logs.signature_types import EXCEPTION_NAME, PCI_ID, Category, Role, Signature, row
from workflows.domain.findings import FindingKind

__all__ = ["ROWS"]

_C, _K = Category, FindingKind
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
ROWS: tuple[Signature, ...] = (
    # --- srun's verdict on each task: rank and node are certain ---
    row("srun_task_oom", _C.HOST_OOM, _K.KILLED, _CU, 100, _SRUN_TASK + r"Out Of Memory", signal=9,
         hints=_CLIENT_HINTS),
    row("srun_task_segfault", _C.SEGFAULT, _K.SEGFAULT, _CU, 100, _SRUN_TASK + r"(?P<signal>Segmentation fault)",
         hints=_CLIENT_HINTS),
    row("srun_task_bus_error", _C.BUS_ERROR, _K.SEGFAULT, _CU, 100, _SRUN_TASK + r"(?P<signal>Bus error)",
         hints=_CLIENT_HINTS),
    row("srun_task_killed", _C.SLURM_TASK_EXIT, _K.KILLED, _CU, 100, _SRUN_TASK + r"Killed", signal=9,
         hints=_CLIENT_HINTS),
    row("srun_task_signal", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 100,
         _SRUN_TASK + r"(?P<signal>Aborted|Floating point exception|Illegal instruction)", hints=_CLIENT_HINTS),
    # srun stops the remaining tasks after one failed (or on cancel/requeue): they are not the cause.
    row("srun_task_terminated", _C.SLURM_TASK_EXIT, _K.TERMINATED, _VI, 100, _SRUN_TASK + r"Terminated", signal=15,
         hints=_CLIENT_HINTS),
    # torchrun's agent stopped by a signal it handles (SIGTERM, SIGINT, SIGHUP, SIGQUIT): Slurm cancelling or requeuing
    # the step (torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler), not the program's bug.
    row("torch_elastic_signaled", _C.SLURM_TASK_EXIT, _K.TERMINATED, _VI, 100,
         r"SignalException: Process \d+ got signal: (?P<signal>\d+)", hints=("signalexception",)),
    row("srun_task_exit", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         _SRUN_TASK + r"Exited with exit code (?P<exit_code>\d+)", by_signal=True, hints=_CLIENT_HINTS),
    # srun's status listing after the first task ended ("srun: StepId=5.0 task 1: exited abnormally").
    row("srun_task_abnormal", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         _CLIENT + r"(?:StepId=\S+ )?tasks? (?P<ranks>\d+(?:[-,]\d+)*): exited abnormally", hints=_CLIENT_HINTS),
    # slurmstepd's own account of a task's end (slurmd's log at verbose level, or the step's stderr): "task 3 (4321)
    # exited with exit code 1.", "task 3 (4321) exited. Killed by signal 9.", and a task plugin's "Terminating job
    # step 5.0; task 0 exit code 1 exited without notification" (the task died without telling the step; code 0 there
    # is still a failure: it was signaled or aborted).
    row("stepd_task_exit", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 100,
         r"\btask (?P<rank>\d+) (?:\(\d+\) exited with exit code (?=[1-9])"
         r"|exit code (?=\d+ (?:exited|signaled|aborted) without notification))(?P<exit_code>\d+)", by_signal=True,
         hints=("exit code",)),
    row("stepd_task_signal", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 100,
         r"\btask (?P<rank>\d+) \(\d+\) exited\. Killed by signal (?P<signal>\d+)", by_signal=True,
         hints=("killed by signal",)),
    # --- lost nodes ---
    row("srun_node_failure", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _CLIENT + r"error: Node failure on (?P<host>[\w.\-]+)", hints=_CLIENT_HINTS),
    row("srun_launch_failed", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _CLIENT + r"error: Task launch for \S+ failed on node (?P<host>[\w.\-]+)", hints=_CLIENT_HINTS),
    # The "ON <node>" of a stepd line is where that stepd runs, typically a survivor: never blame it.
    row("stepd_node_failure", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 100,
         _STEPD_ANY + r" DUE TO NODE (?:[\w.\-]+ )?FAIL", node_fallback=False, hints=("cancelled at",)),
    # --- Slurm ending the job on purpose: the reason, not a crash of the job's own ---
    row("stepd_time_limit", _C.SLURM_TIME_LIMIT, _K.CANCELLED, _IN, 100, _STEPD + r" DUE TO (?P<message>TIME LIMIT)",
         hints=("cancelled at",)),
    row("stepd_preempted", _C.SLURM_PREEMPTION, _K.REQUEUE, _IN, 100, _STEPD + r" DUE TO (?P<message>PREEMPTION)",
         hints=("cancelled at",)),
    # srun --kill-on-bad-exit: a task failed (which one, srun's own lines say).
    row("stepd_task_failure", _C.SLURM_TASK_EXIT, _K.CANCELLED, _IN, 100, _STEPD + r" DUE TO TASK FAILURE",
         hints=("cancelled at",)),
    row("stepd_requeue", _C.NONE, _K.REQUEUE, _IN, 100, _STEPD + r" DUE TO (?P<message>JOB REQUEUE)",
         hints=("cancelled at",)),
    row("stepd_cancelled", _C.NONE, _K.CANCELLED, _IN, 99, _STEPD + r"(?: DUE TO (?P<message>[^*]+?))? \*\*\*",
         hints=("cancelled at",)),
    row("node_fail_state", _C.SLURM_NODE_FAILURE, _K.NODE_FAILURE, _CU, 98, r"\bNODE_FAIL\b", node_fallback=False,
         hints=("node_fail",)),
    # scontrol, sacct and Slurm's mail: "JobState=TIMEOUT", "1234  train ... TIMEOUT  0:0", "Ended, ..., TIMEOUT"
    row("slurm_state_timeout", _C.SLURM_TIME_LIMIT, _K.CANCELLED, _IN, 98,
         r"\b(?:Job)?State[=:] ?TIMEOUT\b|Ended, Run time \S+, TIMEOUT\b|" + _SACCT + r"TIMEOUT\s+\d+:\d+\s*$",
         hints=("timeout",)),
    row("slurm_state_preempted", _C.SLURM_PREEMPTION, _K.REQUEUE, _IN, 98,
         r"\b(?:Job)?State[=:] ?PREEMPTED\b|Ended, Run time \S+, PREEMPTED\b|" + _SACCT + r"PREEMPTED\s+\d+:\d+\s*$",
         hints=("preempted",)),
    # --- GPU and fabric hardware ---
    row("nvrm_xid", _C.XID, _K.XID, _CU, 95, rf"NVRM: Xid \((?:PCI:)?(?P<gpu>{PCI_ID})?[^)]*\): (?P<xid>\d+)\b",
         xid_catalog=True, hints=("nvrm: xid",)),
    # The driver's and NVML's names for it too: NV_ERR_GPU_IS_LOST, whose text is "GPU lost from the bus" (NVRM's
    # failed RPCs, "Check failed: ..."), and NVML_ERROR_GPU_IS_LOST ("GPU is lost").
    row("gpu_fell_off_bus", _C.GPU_FELL_OFF_BUS, _K.CUDA_ERROR, _CU, 95,
         r"fallen off the bus|\bGPU is lost\b|\bGPU lost from the bus\b|\bNV(?:ML)?_ERR(?:OR)?_GPU_IS_LOST\b"
         rf"|Unable to determine the device handle for GPU ?(?P<gpu>{PCI_ID})",
         hints=("fallen off the bus", "gpu is lost", "gpu lost from the bus", "_gpu_is_lost",
             "unable to determine the device handle")),
    row("cuda_ecc", _C.CUDA_ECC, _K.CUDA_ERROR, _CU, 94,
         _NOT_A_HINT + r"cudaErrorECCUncorrectable|(?i:uncorrectable ECC error)|(?i:double[- ]bit ECC)",
         hints=("eccuncorrectable", "uncorrectable ecc", "bit ecc")),
    # A work request that completed in error. ibverbs says "transport retry counter exceeded" / "RNR retry counter
    # exceeded"; UCX says "Transport retry count exceeded" / "Receive-no-ready retry count exceeded" and prints the
    # CQE's syndrome, "(synd 0x15 vend 0x81 ...)", only for a completion with error (flushes are traced, not logged).
    row("ib_completion_error", _C.NETWORK_IB_ERROR, _K.COMM_ERROR, _VI, 93,
         r"NET/IB\w*\s*:\s*Got completion|IBV_WC_\w+_ERR|local catastrophic error"
         r"|(?i:(?:transport|RNR|receive-no-ready) retry count(?:er)? exceeded)|\(synd 0x[0-9a-f]+ vend 0x[0-9a-f]+",
         hints=("got completion", "ibv_wc_", "retry count", "catastrophic", "(synd 0x")),
    row("ib_error", _C.NETWORK_IB_ERROR, _K.COMM_ERROR, _VI, 93,
         r"NET/IB\w*\s*:.*(?:[Ee]rror|[Ff]ail)|\bibv_\w+(?:\(\))? failed|\bibv_poll_cq\b.*(?:[Ee]rror|[Ff]ail)"
         r"|\bmlx5\w*\b.*(?i:error|fail|catastroph|unrecoverable|compromised|link down|port down|cable unplugged)"
         r"|\bib\w*: .*port \d+ .*state (?:changed to )?(?i:down)", hints=("net/ib", "ibv_", "mlx5", "state ")),
    # dmesg, DCGM or a node agent naming an XID without the NVRM line: "Xid 79", "XID=48"
    row("xid_mention", _C.XID, _K.XID, _CU, 92,
         r"(?<![\w-])(?:Xid|XID)(?: error| event)?s?\s*+(?:[:=#]\s*+)?(?P<xid>\d{1,3})\b(?![.\d])", xid_catalog=True,
         hints=("xid",)),
    # --- CUDA: before any communication row, so "watchdog terminated with exception: CUDA error: ..." is CUDA ---
    # Out of device memory and device-side asserts (an index out of range in a kernel) are the program's doing.
    # NCCL prints a failed CUDA call as "Cuda failure 'out of memory'" (runtime) or "Cuda failure 2 'out of memory'"
    # (driver, with the CUresult). PyTorch's allocator explains the failed allocation in the rest of its message,
    # which is all that is left when the head was cut off or the message wrapped: "Tried to allocate 20.00 MiB (GPU 0;
    # ... reserved in total by PyTorch)", since 2.1 "GPU 0 has a total capacity of ... of which ... is free ... is
    # reserved by PyTorch but unallocated". XLA and TensorFlow say RESOURCE_EXHAUSTED / "OOM when allocating tensor".
    row("cuda_oom", _C.CUDA_OOM, _K.CUDA_ERROR, _CU, 90,
         r"CUDA (?:error: )?out of memory|HIP (?:error: )?out of memory|(?:Cuda|HIP) failure (?:\d+ )?'?out of memory"
         r"|[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: out of memory"
         r"|\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b|CUBLAS_STATUS_ALLOC_FAILED|"
         + _NOT_A_HINT + r"cudaErrorMemoryAllocation"
         r"|Tried to allocate [\d.]+ \w+ \(GPU \d+;|\bGPU ?\d* has a total capacity of [\d.]+ \w+ of which"
         r"|reserved in total by PyTorch|is reserved by PyTorch but unallocated"
         r"|RESOURCE_EXHAUSTED: Out of memory while trying to allocate|\bOOM when allocating tensor",
         hints=("out of memory", "outofmemoryerror", "cublas_status_alloc_failed", "cudaerrormemoryallocation",
             "tried to allocate", "has a total capacity", "by pytorch", "oom when allocating")),
    row("cuda_device_assert", _C.CUDA_DEVICE_ASSERT, _K.CUDA_ERROR, _CU, 90,
         r"device-side assert(?:ion)? triggered|" + _NOT_A_HINT + r"cudaErrorAssert\b"
         r"|\.cuh?:\d+: .*block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion .* failed",
         hints=("device-side assert", "cudaerrorassert", "assertion")),
    row("cuda_illegal_address", _C.CUDA_ILLEGAL_ADDRESS, _K.CUDA_ERROR, _CU, 89,
         r"(?P<message>an illegal memory access was encountered|misaligned address"
         r"|an illegal instruction was encountered)|"
         + _NOT_A_HINT + r"cudaError(?:IllegalAddress|MisalignedAddress|IllegalInstruction)\b",
         hints=("illegal memory access", "misaligned address", "illegal instruction", "cudaerror")),
    row("cuda_launch_failure", _C.CUDA_LAUNCH_FAILURE, _K.CUDA_ERROR, _CU, 89,
         r"(?P<message>unspecified launch failure|the launch timed out and was terminated)|"
         + _NOT_A_HINT + r"cudaErrorLaunch(?:Failure|Timeout)\b",
         hints=("unspecified launch failure", "launch timed out", "cudaerrorlaunch")),
    row("cuda_init_failure", _C.CUDA_INIT_FAILURE, _K.CUDA_ERROR, _CU, 88,
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
    row("cuda_unknown_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 87,
         r"[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: unknown error|CUDA_ERROR_UNKNOWN|"
         + _NOT_A_HINT + r"cudaErrorUnknown\b",
         hints=("unknown error", "cuda_error_unknown", "cudaerrorunknown")),
    # NCCL's name for a CUDA call that failed under it (the CUDA error itself, if printed, follows it).
    row("nccl_unhandled_cuda", _C.NCCL_ERROR, _K.CUDA_ERROR, _CU, 86, r"unhandled cuda error|ncclUnhandledCudaError",
         hints=("unhandled cuda error", "ncclunhandledcudaerror")),
    row("cuda_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 84,
         r"(?:[Cc][Uu][Dd][Aa] (?:runtime |driver )?error(?: \(\d+\))? ?: |Cuda failure ')(?P<message>[^'\n]+)",
         weak=True, hints=("cuda ",)),
    row("cuda_library_error", _C.CUDA_UNKNOWN_ERROR, _K.CUDA_ERROR, _CU, 83,
         r"\bCUBLAS_STATUS_(?!SUCCESS)\w+|\bCUDNN_STATUS_(?!SUCCESS)\w+|cuDNN error", weak=True,
         hints=("cublas_status_", "cudnn_status_", "cudnn error")),
    # --- the job's own errors, most specific first ---
    # Reading the checkpoint the job resumes from failed: a torch.save zip cut short ("failed finding central
    # directory", "unexpected EOF"), an empty file (EOFError), a pickle overwritten ("invalid load key"), a safetensors
    # header torn, a DCP directory without its .metadata or a shard, a DeepSpeed shard missing, Megatron's "could not
    # load the checkpoint", HF's get_last_checkpoint picking an unfinished checkpoint-N ("Can't find a valid
    # checkpoint at"). The checkpoint's fault, not the code's or the node's: a restart loads it again unless the job
    # is pointed at an older complete one. Not DCP's CheckpointException nor Megatron core's CheckpointingException:
    # saves raise them too; the load error they wrap (a missing .metadata, an EOF) is printed inside and read here.
    row("checkpoint_load", _C.CHECKPOINT_IO_ERROR, _K.CHECKPOINT_LOAD, _CU, 82,
         r"PytorchStreamReader failed|failed finding central directory|unexpected EOF, expected \d+ more bytes"
         r"|invalid load key|EOFError: Ran out of input|SafetensorError|Error while deserializing header"
         r"|could not load the checkpoint"
         r"|Can't find a valid checkpoint at (?P<checkpoint>[^\s'\",;]+)"
         r"|No such file or directory: '(?P<checkpoint_file>[^']*(?:/\.metadata|_states\.pt|\.distcp))'",
         hints=("pytorchstreamreader", "central directory", "unexpected eof", "invalid load key", "ran out of input",
             "safetensor", "deserializing header", "could not load the checkpoint", "valid checkpoint at",
             "no such file")),
    # /dev/shm exhausted: the DataLoader's shared memory, not a checkpoint.
    row("shm_exhausted", _C.BUS_ERROR, _K.KILLED, _CU, 81,
         r"DataLoader worker \(pid(?:\(s\))? [\d, ]+\) is killed by signal: Bus error|unable to write to file </torch_"
         r"|insufficient shared memory \(shm\)|Unexpected bus error encountered in worker", signal=7,
         hints=("dataloader worker", "unable to write to file", "insufficient shared memory", "unexpected bus error")),
    # Keras's and MindSpore's TerminateOnNaN print "Invalid loss, terminating training"; HF's DebugUnderflowOverflow
    # "Detected inf/nan during batch_number=N".
    row("nan_loss", _C.NAN_LOSS, _K.PYTHON_EXCEPTION, _CU, 80,
         r"[Ff]ound [Nn]a[Nn] in|NaN or Inf found in|[Nn]a[Nn] loss|[Dd]etected (?:inf/)?[Nn]a[Nn]"
         r"|[Ee]ncountered [Nn]a[Nn]"
         r"|returned nan values in its \d+\w* output|is non-finite, so it cannot be clipped|Invalid loss, terminating"
         r"|Minimum loss scale reached|loss scale already at minimum|[Gg]rad[ _]norm\S*\s*[:=]\s*(?:[Nn]a[Nn]|NAN)\b",
         hints=("nan", "non-finite", "loss scale", "invalid loss")),
    # The loss printed or checked as NaN or Inf: training diverged. "loss: nan", "'loss': nan", a named term
    # ("loss_cls: nan"), "Loss is inf", Detectron2's FloatingPointError "Loss became infinite or NaN", MMCV's "loss
    # become infinite or NaN", Lightning's "The loss returned in `training_step` is nan" (or "is tensor(nan, ...)"),
    # Composer's "Train loss contains a NaN", nanoGPT's "iter 3010: loss nan, time 1019.95ms".
    row("loss_not_finite", _C.NAN_LOSS, _K.PYTHON_EXCEPTION, _CU, 80,
         r"[Ll][Oo][Ss][Ss](?:_[A-Za-z0-9]{1,32}+){0,4}+(?![A-Za-z0-9])['\"]?(?: value| returned in `\w+`)?\s*"
         r"(?:is\s|became\s|become\s|went\s|contains\s(?:an?\s)?|=|:)\s*['\"]?(?:tensor\()?"
         r"(?:[Nn]a[Nn]|NAN|-?[Ii]nf(?:inite|inity)?|-?INF)\b"
         r"|\biter \d+: loss (?:nan|-?inf), ", hints=("loss",)),
    # Writing a checkpoint failed (or the storage under it did): the job's own output, on the cluster's storage.
    row("checkpoint_io", _C.CHECKPOINT_IO_ERROR, _K.PYTHON_EXCEPTION, _CU, 80,
         r"No space left on device|Disk quota exceeded|PytorchStreamWriter failed"
         r"|inline_container\.cc.*(?:unexpected pos|file write failed)"
         r"|Input/output error|Read-only file system|Stale file handle"
         r"|write\(\): fd \d+ failed|File \S+ cannot be opened|Parent directory \S+ does not exist"
         r"|Permission denied: .*(?i:ckpt|checkpoint|\.pth?\b|\.safetensors|\.bin\b|/save|/output)",
         hints=("no space left", "quota exceeded", "pytorchstreamwriter", "inline_container",
             "input/output error", "read-only file system", "stale file handle", "permission denied", "write(): fd",
             "cannot be opened", "parent directory")),
    row("dataloader_killed", _C.DATALOADER_KILLED, _K.KILLED, _CU, 79,
         r"DataLoader worker \(pid(?:\(s\))? [\d, ]+\) "
         r"(?:is killed by signal: (?P<signal>[\w ]+)|exited unexpectedly)", hints=("dataloader worker",)),
    # Host OOM: the kernel's or the cgroup's killer, or an allocation the host could not serve. Slurm's own words
    # too: slurmstepd's "Detected 1 oom-kill event(s) in StepId=12.0", its memory accounting's "Step 12.0 exceeded
    # memory limit (123 > 100), being killed" and, at the step's end, "Exceeded step memory limit at some point."
    row("oom_kill", _C.HOST_OOM, _K.KILLED, _CU, 78,
         r"(?i:\boom[-_ ]kill)|Out of memory: Killed process|(?i:memory cgroup out of memory)|OOM Killed"
         r"|\bOOMKilled\b|Out Of Memory|\bOUT_OF_ME(?:MORY|\+)|\bKilled process \d+ \("
         r"|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|^(?:builtins\.)?MemoryError\b"
         r"|\[Errno 12\] Cannot allocate memory|\bExceeded (?:step|job) memory limit\b"
         r"|\b(?:Step|Job) \S+ exceeded memory limit \(\d+ > \d+\), being killed", signal=9,
         hints=("oom", "out of memory", "out_of_me", "killed process", "defaultcpuallocator", "memoryerror",
             "cannot allocate memory", "memory limit")),
    # --- death by signal, as printed by faulthandler, the shell, torchrun, UCX or MPI ---
    row("segfault", _C.SEGFAULT, _K.SEGFAULT, _CU, 77,
         r"Segmentation fault|\bSIGSEGV\b|\b[Ss]ignal:? 11\b|Caught signal 11\b", signal=11,
         hints=("segmentation fault", "sigsegv", "ignal")),
    row("bus_error", _C.BUS_ERROR, _K.SEGFAULT, _CU, 77, r"\bBus error\b|\bSIGBUS\b|\b[Ss]ignal:? 7\b", signal=7,
         hints=("bus error", "sigbus", "ignal")),
    # Shapes, devices, dtypes, state dicts, autograd misuse: the code is wrong, whatever exception carries it.
    row("user_runtime_error", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 76,
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
    row("python_exception", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 75,
         rf"^(?P<exception>(?:[A-Za-z_]\w*\.)*(?:{_USER_TYPES}))(?::\s*(?P<message>\S.*))?$",
         hints=("error", "exception")),
    row("abort", _C.SLURM_TASK_EXIT, _K.FATAL_SIGNAL, _CU, 70,
         r"Fatal Python error: Aborted|\bSIGABRT\b|\b[Ss]ignal:? 6\b", signal=6,
         hints=("aborted", "sigabrt", "ignal")),
    # --- communication: this rank lost a peer or timed out waiting; the class is the peer's ---
    row("nccl_watchdog_timeout", _C.NCCL_TIMEOUT, _K.COMM_ERROR, _VI, 65,
         r"Watchdog caught collective operation timeout|collective operation timeout|Timeout at NCCL work"
         r"|Some NCCL operations have failed or timed out|NCCL (?:operation|collective|communicator) timed out"
         r"|Received a dump signal due to a collective timeout|NCCL timeout",
         hints=("collective operation timeout", "timeout at nccl work", "nccl operations have failed", "timed out",
             "dump signal", "nccl timeout")),
    row("nccl_heartbeat", _C.NCCL_TIMEOUT, _K.COMM_ERROR, _VI, 65,
         r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds|no heartbeat of its watchdog"
         r"|no watchdog heartbeat|ProcessGroupNCCL's watchdog",
         hints=("heartbeat", "watchdog got stuck", "processgroupnccl's watchdog")),
    row("gloo_timeout", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 62,
         r"Timed out waiting \d+ ?ms for (?:recv|send) operation|ProcessGroupGloo\w*::\w+.*(?:timed out|Timeout)"
         r"|Rank (?P<peer_rank>\d+) failed to pass monitoredBarrier",
         hints=("timed out waiting", "processgroupgloo", "monitoredbarrier")),
    row("nccl_remote_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"ncclRemoteError|remote process exited or there was a network error",
         hints=("ncclremoteerror", "remote process exited")),
    row("nccl_system_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"unhandled system error|ncclSystemError|ncclInternalError|NCCL error in: \S+ internal error"
         r"|ncclInvalidUsage|ncclInvalidArgument|\binvalid usage \(run with|\binternal error - please report",
         hints=("unhandled system error", "ncclsystemerror", "ncclinternalerror", "internal error", "ncclinvalid",
             "invalid usage")),
    row("nccl_init_failure", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 60,
         r"ncclCommInit\w* failed|Failed to initialize NCCL|Duplicate GPU detected"
         r"|\[(?P<rank>\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[(?P<peer_rank>\d+)\]"
         r"|NCCL WARN .*(?:Connect to \S+ failed|[Bb]ootstrap.*(?:failed|[Tt]imeout|[Ee]rror))",
         hints=("ncclcomminit", "failed to initialize nccl", "duplicate gpu", "nccluniqueid", "nccl warn")),
    # A peer's socket closed under gloo (or a plain Python socket); NCCL's lines have their own rows.
    # A retried HTTP request's "Connection reset by peer" warning is not a collective's.
    row("peer_lost", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 59,
         r"^(?!.*(?:NCCL|[Rr]etry|[Rr]etrying|WARNING)).*?Connection (?:closed|reset) by peer",
         hints=("by peer",)),
    row("nccl_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 58,
         r"\bNCCL error\b|\bNCCL Error \d|NCCL WARN .*(?:[Ee]rror|[Ff]ail|[Cc]losed|[Rr]eset)|\bnccl[A-Z]\w*Error\b",
         hints=("nccl",)),
    row("gloo_error", _C.GLOO_ERROR, _K.COMM_ERROR, _VI, 57,
         r"\[enforce fail at [^\]]*gloo[^\]]*\]|gloo/transport/\S+\]|Gloo connectFullMesh failed"
         r"|ProcessGroupGloo\w*::\w+.*(?:failed|[Ee]rror)|\bgloo\b.*(?:[Ee]rror|failed)", hints=("gloo",)),
    row("nccl_aborted", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 55,
         r"NCCL communicator was aborted|[Cc]ommunicator was aborted|ncclCommAbort",
         hints=("was aborted", "ncclcommabort")),
    # The c10d store and rendezvous: a communicator that could not be set up.
    row("c10d_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 52,
         r"\bDistNetworkError\b|\bDistStoreError\b|client socket has timed out|server socket has failed"
         r"|\bSocket Timeout\b|TCPStore\w*.*(?:failed|timed out|[Ee]rror)|\bRendezvous\w*(?:Error|Exception)\b",
         hints=("distnetworkerror", "diststoreerror", "socket", "tcpstore", "rendezvous")),
    row("dist_backend_error", _C.NCCL_ERROR, _K.COMM_ERROR, _VI, 50, r"\bDistBackendError\b", weak=True,
         hints=("distbackenderror",)),
    # --- launchers' summaries: a child failed; the cause is elsewhere in the log, if anywhere ---
    row("torchrun_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"\bfailed \(exitcode: (?P<exit_code>-?\d+)\)", by_signal=True, hints=("failed (exitcode",)),
    row("launcher_exit", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"exits with return code = (?P<exit_code>-?[1-9]\d*)", by_signal=True, hints=("exits with return code",)),
    row("subprocess_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _CU, 40,
         r"CalledProcessError: Command .*(?:returned non-zero exit status (?P<exit_code>-?\d+)"
         r"|died with <Signals\.SIG\w+: (?P<signal>\d+)>)", by_signal=True, hints=("calledprocesserror",)),
    # torchrun's summary block; diagnose reads the rank, host and exit code on the lines after its header.
    row("elastic_root_cause", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 39,
         r"Root Cause \(first observed failure\)", hints=("root cause",)),
    row("elastic_exitcode", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 38,
         r"^\s*exitcode\s*: (?P<exit_code>-?\d+)", by_signal=True, hints=("exitcode",)),
    row("torchrun_child_failed", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 38, r"\bChildFailedError\b",
         hints=("childfailederror",)),
    row("signal_received", _C.ELASTIC_CHILD_FAILED, _K.RANK_EXIT, _IN, 37,
         r"\bSignal (?P<signal>\d+) \(SIG\w+\) received by PID", by_signal=True, hints=("received by pid",)),
    # The shell's job-control line: "slurm_script: line 12:  4321 Killed   python train.py"
    row("shell_killed", _C.SLURM_TASK_EXIT, _K.KILLED, _CU, 36,
         r"^(?:\S+: line \d+: +\d+ +)?Killed(?:\s|$)", signal=9, hints=("killed",)),
    # A trainer announcing its own exit (the demo: "fatal error (...): exiting with code 13").
    row("exit_code", _C.SLURM_TASK_EXIT, _K.RANK_EXIT, _CU, 35,
         r"(?:\bexit(?:ing|ed)?\b[^\n]{0,40}?|\bterminated|\bfinished) with (?:exit )?(?:code|status):? "
         r"(?P<exit_code>-?[1-9]\d*)", flags=re.IGNORECASE,
         by_signal=True, hints=("exit", "terminated with", "finished with")),
    # --- the last line of any other traceback: most likely the program's own error ---
    row("python_exception_other", _C.USER_EXCEPTION, _K.PYTHON_EXCEPTION, _CU, 20,
         r"^" + EXCEPTION_NAME + r"(?::\s*(?P<message>.*))?$", weak=True, hints=("error", "exception")),
)
# fmt: on
