"""The failure-signature library: every row on realistic text, prefixes, the XID catalogue, hints and the table."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from activities.logs.signature_fields import extract
from activities.logs.signature_types import CATEGORIES, Category, Role, Signature
from activities.logs.signatures import SIGNATURES, _hints_in, match, prepare
from tests.unit.logs.regex_proof import proved
from workflows.domain.findings import FindingKind

DATA = Path(__file__).resolve().parents[2] / "data"


C = Category

# (line, row id, category, fields the extracted line must have). Verbatim where a real system prints it; the
# prefixes are the ones launchers really put in front (srun --label, [rankN]:, NCCL's host:pid:tid [dev]).
SIGNATURE_CASES: list[tuple[str, str, Category, dict[str, Any]]] = [
    # --- srun and slurmstepd ---
    ("srun: error: gpu-n3: task 5: Out Of Memory", "srun_task_oom", C.HOST_OOM, {"rank": 5, "host": "gpu-n3"}),
    ("srun: error: n1: task 2: Segmentation fault (core dumped)", "srun_task_segfault", C.SEGFAULT, {"signal": 11}),
    (
        "srun: error: Orion-18-69: task 289: Bus error",
        "srun_task_bus_error",
        C.BUS_ERROR,
        {"rank": 289, "ranks": (289,)},
    ),
    ("srun: error: n2: tasks 0-3: Killed", "srun_task_killed", C.SLURM_TASK_EXIT, {"ranks": (0, 1, 2, 3), "signal": 9}),
    ("srun: error: gpu-a01: task 2: Aborted (core dumped)", "srun_task_signal", C.SLURM_TASK_EXIT, {"signal": 6}),
    ("srun: error: n2: task 3: Terminated", "srun_task_terminated", C.SLURM_TASK_EXIT, {"signal": 15}),
    # torchrun's agent on the lab when Slurm requeued the job (issue 11): no user bug, a restart does not repeat it
    (
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 31645 got signal: 15",
        "torch_elastic_signaled",
        C.SLURM_TASK_EXIT,
        {"signal": 15},
    ),
    ("srun: error: node-17: task 12: Exited with exit code 1", "srun_task_exit", C.SLURM_TASK_EXIT, {"exit_code": 1}),
    # 139 = 128 + SIGSEGV: a wrapper shell reporting its child's segfault
    ("srun: error: node-17: task 4: Exited with exit code 139", "srun_task_exit", C.SEGFAULT, {"exit_code": 139}),
    ("srun: StepId=5.0 task 3: exited abnormally", "srun_task_abnormal", C.SLURM_TASK_EXIT, {"rank": 3}),
    ("srun: error: Node failure on gpu-n9", "srun_node_failure", C.SLURM_NODE_FAILURE, {"host": "gpu-n9"}),
    ("salloc: error: Node failure on gpu-n10", "srun_node_failure", C.SLURM_NODE_FAILURE, {"host": "gpu-n10"}),
    (
        "srun: error: Task launch for StepId=5.0 failed on node n3: Communication connection failure",
        "srun_launch_failed",
        C.SLURM_NODE_FAILURE,
        {"host": "n3"},
    ),
    (
        "slurmstepd: error: *** JOB 811 ON n1 CANCELLED AT 2024-03-01T10:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG"
        " FOR DETAILS ***",
        "stepd_node_failure",
        C.SLURM_NODE_FAILURE,
        {"host": None},
    ),
    (
        "slurmstepd: error: *** STEP 494583.0 ON gpu-12 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
        "stepd_time_limit",
        C.SLURM_TIME_LIMIT,
        {"message": "TIME LIMIT"},
    ),
    (
        "slurmstepd-n4: error: *** JOB 5 ON n4 CANCELLED AT 2026-11-30T03:47:28 DUE TO PREEMPTION ***",
        "stepd_preempted",
        C.SLURM_PREEMPTION,
        {"host": "n4"},
    ),
    (
        "slurmstepd-n1: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-11-30T03:47:28 DUE TO JOB REQUEUE ***",
        "stepd_requeue",
        C.NONE,
        {},
    ),
    ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-30T03:49:43 ***", "stepd_cancelled", C.NONE, {}),
    (
        "[2026-04-29T23:36:37.809] error: *** STEP 9.0 ON gpu-n4 CANCELLED AT 2026-04-29T23:36:37 DUE TO TASK"
        " FAILURE ***",
        "stepd_task_failure",
        C.SLURM_TASK_EXIT,
        {"host": "gpu-n4"},
    ),
    # slurmstepd's own words on a task's end (mgr.c at verbose level; a task plugin's "without notification")
    (
        "[2024-06-02T11:04:05.120] [812.0] task 2 (40512) exited with exit code 1.",
        "stepd_task_exit",
        C.SLURM_TASK_EXIT,
        {"rank": 2, "exit_code": 1},
    ),
    (
        "slurmstepd: error: Terminating job step 4711.0; task 3 exit code 2 exited without notification",
        "stepd_task_exit",
        C.SLURM_TASK_EXIT,
        {"rank": 3, "exit_code": 2},
    ),
    (
        "slurmstepd: error: Terminating job step 88.0; task 5 exit code 0 signaled without notification",
        "stepd_task_exit",
        C.SLURM_TASK_EXIT,
        {"rank": 5, "exit_code": 0},
    ),
    (
        "[812.0] task 6 (40516) exited. Killed by signal 11 (core dumped).",
        "stepd_task_signal",
        C.SEGFAULT,
        {"rank": 6, "signal": 11},
    ),
    ("[812.0] task 4 (40514) exited. Killed by signal 9.", "stepd_task_signal", C.SLURM_TASK_EXIT, {"signal": 9}),
    ("JobId=5 JobName=train JobState=NODE_FAIL Reason=NodeDown", "node_fail_state", C.SLURM_NODE_FAILURE, {}),
    ("   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)", "slurm_state_timeout", C.SLURM_TIME_LIMIT, {}),
    (
        "123456       pretrain        gpu      acct1         64    TIMEOUT      0:0",
        "slurm_state_timeout",
        C.SLURM_TIME_LIMIT,
        {},
    ),
    ("   JobState=PREEMPTED Reason=None Dependency=(null)", "slurm_state_preempted", C.SLURM_PREEMPTION, {}),
    # --- GPU and fabric hardware ---
    (
        "[Mon Nov 30 03:40:01 2026] NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable"
        " double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "nvrm_xid",
        C.XID,
        {"xid": 48, "gpu": "0000:18:00"},
    ),
    (
        "Nov 30 03:40:01 gpu-a07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the"
        " bus.",
        "nvrm_xid",
        C.GPU_FELL_OFF_BUS,
        {"xid": 79, "host": "gpu-a07", "gpu": "0000:3b:00"},
    ),
    (
        "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error",
        "gpu_fell_off_bus",
        C.GPU_FELL_OFF_BUS,
        {"gpu": "0000:0B:00.0"},
    ),
    (
        "               NVRM: fallen off the bus and is not responding to commands.",
        "gpu_fell_off_bus",
        C.GPU_FELL_OFF_BUS,
        {},
    ),
    # NV_ERR_GPU_IS_LOST's status text, and NVML's name for the same state
    (
        "[ 4123.500101] NVRM: _issueRpcAndWait: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F)",
        "gpu_fell_off_bus",
        C.GPU_FELL_OFF_BUS,
        {},
    ),
    (
        "dcgm: nvmlDeviceGetTemperature returned NVML_ERROR_GPU_IS_LOST for GPU 0000:41:00.0",
        "gpu_fell_off_bus",
        C.GPU_FELL_OFF_BUS,
        {"gpu": "0000:41:00.0"},
    ),
    (
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "cuda_ecc",
        C.CUDA_ECC,
        {"exception": "RuntimeError"},
    ),
    (
        "kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer"
        " 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid fd00::ff22"
        " remoteGids fd00::ff1f",
        "ib_completion_error",
        C.NETWORK_IB_ERROR,
        {"host": "kp-ddp-worker-0", "gpu": "4"},
    ),
    (
        "Jan 12 04:11:09 gpu-n4 kernel: mlx5_core 0000:41:00.0: mlx5_fw_fatal_reporter_err_work:2029:(pid 1234): Driver"
        " is in error state. Unloading",
        "ib_error",
        C.NETWORK_IB_ERROR,
        {"host": "gpu-n4", "gpu": None},  # the NIC's PCI id is not a GPU
    ),
    # UCX's completion-with-error report (newer and older layouts) and ibverbs' status string
    (
        "[gpu-n7:81234:0:81234] ib_mlx5_log.c:177  Remote access on mlx5_2:1/IB (synd 0x13 vend 0x88 hw_synd 0/0)",
        "ib_completion_error",
        C.NETWORK_IB_ERROR,
        {"host": "gpu-n7"},
    ),
    (
        "[gpu-n7:81234 :0:81234] ib_mlx5_log.c:143  Error on QP 0x1a2b wqe[12]: Receive-no-ready retry count exceeded"
        " (synd 0x16 vend 0x82) opcode SEND",
        "ib_completion_error",
        C.NETWORK_IB_ERROR,
        {"host": "gpu-n7"},
    ),
    (
        "ucp_worker.c:1783 UCX  ERROR  Transport retry count exceeded on mlx5_1:1/RoCE",
        "ib_completion_error",
        C.NETWORK_IB_ERROR,
        {},
    ),
    ("Completion with error: RNR retry counter exceeded (status 13)", "ib_completion_error", C.NETWORK_IB_ERROR, {}),
    ("gpud: XID 31 event on GPU-4a6f2c1e (PCI 0000:b1:00.0)", "xid_mention", C.XID, {"xid": 31}),
    # --- CUDA ---
    (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity;"
        " 77.80 GiB already allocated; 11.31 MiB free; 78.27 GiB reserved in total by PyTorch)",
        "cuda_oom",
        C.CUDA_OOM,
        {"gpu": "0", "exception": "torch.cuda.OutOfMemoryError"},
    ),
    (
        "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of"
        " 79.15 GiB of which 1.12 GiB is free.",
        "cuda_oom",
        C.CUDA_OOM,
        {"rank": 2, "gpu": "2"},
    ),
    # the allocator's account of a failed allocation without its "CUDA out of memory" head (cut off or wrapped)
    (
        "Tried to allocate 1.50 GiB (GPU 3; 39.59 GiB total capacity; 36.12 GiB already allocated; 1.02 GiB free;"
        " 37.40 GiB reserved in total by PyTorch)",
        "cuda_oom",
        C.CUDA_OOM,
        {"gpu": "3"},
    ),
    (
        "GPU 1 has a total capacity of 23.65 GiB of which 18.06 MiB is free. Including non-PyTorch memory, this process"
        " has 23.62 GiB memory in use.",
        "cuda_oom",
        C.CUDA_OOM,
        {"gpu": "1"},
    ),
    (
        "Of the allocated memory 20.17 GiB is allocated by PyTorch, and 2.96 GiB is reserved by PyTorch but"
        " unallocated.",
        "cuda_oom",
        C.CUDA_OOM,
        {},
    ),
    # NCCL's CUCHECK prints the CUresult's number before the driver's text
    (
        "gpu-n3:4021:4090 [2] transport/p2p.cc:210 NCCL WARN Cuda failure 2 'out of memory'",
        "cuda_oom",
        C.CUDA_OOM,
        {"host": "gpu-n3", "gpu": "2"},
    ),
    ("gpu-n3:4021:4090 [1] NCCL WARN HIP failure 'out of memory'", "cuda_oom", C.CUDA_OOM, {"gpu": "1"}),  # RCCL
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 33762398024"
        " bytes.",
        "cuda_oom",
        C.CUDA_OOM,
        {"exception": "jaxlib.xla_extension.XlaRuntimeError"},
    ),
    (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with"
        " shape[64,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "cuda_oom",
        C.CUDA_OOM,
        {},
    ),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_device_assert", C.CUDA_DEVICE_ASSERT, {}),
    (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0] Assertion"
        ' `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.',
        "cuda_device_assert",
        C.CUDA_DEVICE_ASSERT,
        {},
    ),
    (
        "[rank5]: torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "cuda_illegal_address",
        C.CUDA_ILLEGAL_ADDRESS,
        {"rank": 5, "message": "an illegal memory access was encountered"},
    ),
    ("RuntimeError: CUDA error: misaligned address", "cuda_illegal_address", C.CUDA_ILLEGAL_ADDRESS, {}),
    ("RuntimeError: CUDA error: unspecified launch failure", "cuda_launch_failure", C.CUDA_LAUNCH_FAILURE, {}),
    ("RuntimeError: No CUDA GPUs are available", "cuda_init_failure", C.CUDA_INIT_FAILURE, {}),
    (
        "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.",
        "cuda_init_failure",
        C.CUDA_INIT_FAILURE,
        {},
    ),
    (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling"
        " NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver /"
        " cuda driver combination",
        "cuda_init_failure",
        C.CUDA_INIT_FAILURE,
        {},
    ),
    (
        "n4:311:311 [0] NCCL WARN Cuda failure 3 'initialization error'",
        "cuda_init_failure",
        C.CUDA_INIT_FAILURE,
        {"host": "n4"},
    ),
    (
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a"
        " driver from http://www.nvidia.com/Download/index.aspx",
        "cuda_init_failure",
        C.CUDA_INIT_FAILURE,
        {},
    ),
    ("RuntimeError: CUDA error: unknown error", "cuda_unknown_error", C.CUDA_UNKNOWN_ERROR, {}),
    # the THC-era format of old PyTorch and Lua Torch
    (
        "THCudaCheck FAIL file=x.cu line=9 error=30 : cuda runtime error (30) : unknown error",
        "cuda_unknown_error",
        C.CUDA_UNKNOWN_ERROR,
        {},
    ),
    (
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
        "cuda_oom",
        C.CUDA_OOM,
        {},
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970,"
        " unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        "nccl_unhandled_cuda",
        C.NCCL_ERROR,
        {"exception": "torch.distributed.DistBackendError"},
    ),
    (
        "RuntimeError: CUDA error: operation not supported",
        "cuda_error",
        C.CUDA_UNKNOWN_ERROR,
        {"message": "operation not supported"},
    ),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", "cuda_library_error", C.CUDA_UNKNOWN_ERROR, {}),
    # --- the job's own errors ---
    (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        "shm_exhausted",
        C.BUS_ERROR,
        {"signal": 7},
    ),
    ("Loss is nan, stopping training", "loss_not_finite", C.NAN_LOSS, {}),
    ("[rank0]: Epoch 3 step 1200 | train_loss=inf | lr=3e-4", "loss_not_finite", C.NAN_LOSS, {"rank": 0}),
    (
        "[rank0]: AssertionError: Rank 0: found NaN in local grad norm in backward pass before data-parallel"
        " communication collective. Device: 0, node: gpu-st-p4d-24xlarge-12",
        "nan_loss",
        C.NAN_LOSS,
        {"rank": 0, "host": "gpu-st-p4d-24xlarge-12", "exception": "AssertionError"},
    ),
    (
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
        "nan_loss",
        C.NAN_LOSS,
        {},
    ),
    ("{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.3}", "loss_not_finite", C.NAN_LOSS, {}),
    ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.3}", "nan_loss", C.NAN_LOSS, {}),
    # the frameworks' own NaN guards: Detectron2, MMCV's check hook, Lightning, Composer, Keras, HF's debug_utils
    (
        "FloatingPointError: Loss became infinite or NaN at iteration=5210!",
        "loss_not_finite",
        C.NAN_LOSS,
        {"exception": "FloatingPointError"},
    ),
    ("AssertionError: loss become infinite or NaN!", "loss_not_finite", C.NAN_LOSS, {}),
    ("ValueError: The loss returned in `training_step` is nan.", "loss_not_finite", C.NAN_LOSS, {}),
    (
        "ValueError: The loss returned in `training_step` is tensor(nan, device='cuda:0', grad_fn=<AddBackward0>).",
        "loss_not_finite",
        C.NAN_LOSS,
        {},
    ),
    ("RuntimeError: Train loss contains a NaN.", "loss_not_finite", C.NAN_LOSS, {}),
    # nanoGPT (https://github.com/karpathy/nanoGPT/issues/215)
    ("2023-03-22 09:32:52 iter 3010: loss nan, time 1019.95ms, mfu 14.12%", "loss_not_finite", C.NAN_LOSS, {}),
    ("Epoch(train) [3][1150/5000]  loss_rpn_cls: nan  loss_rpn_bbox: 0.0412", "loss_not_finite", C.NAN_LOSS, {}),
    ("Batch 412: Invalid loss, terminating training", "nan_loss", C.NAN_LOSS, {}),
    ("Detected inf/nan during batch_number=0", "nan_loss", C.NAN_LOSS, {}),
    ("OSError: [Errno 28] No space left on device", "checkpoint_io", C.CHECKPOINT_IO_ERROR, {"exception": "OSError"}),
    # Reading the checkpoint failed: its own row, the load's kind (not the code's).
    (
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {"exception": "RuntimeError"},
    ),
    (
        "RuntimeError: [enforce fail at inline_container.cc:144] . PytorchStreamReader failed reading zip archive: "
        "failed finding central directory",  # https://github.com/open-mmlab/mmdetection/issues/4835
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {},
    ),
    ("EOFError: Ran out of input", "checkpoint_load", C.CHECKPOINT_IO_ERROR, {"exception": "EOFError"}),
    ("_pickle.UnpicklingError: invalid load key, '\\x00'.", "checkpoint_load", C.CHECKPOINT_IO_ERROR, {}),
    (
        "RuntimeError: unexpected EOF, expected 1617891 more bytes. The file might be corrupted.",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {},
    ),
    (
        "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {"exception": "safetensors_rust.SafetensorError"},
    ),
    (
        "FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/step-1000/.metadata'",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {"exception": "FileNotFoundError"},
    ),
    (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/ckpt/global_step10/zero_pp_rank_3_mp_rank_00_optim_states.pt'",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {},
    ),
    (
        "ValueError: Can't find a valid checkpoint at /out/checkpoint-180",
        "checkpoint_load",
        C.CHECKPOINT_IO_ERROR,
        {"exception": "ValueError"},
    ),
    ("could not load the checkpoint", "checkpoint_load", C.CHECKPOINT_IO_ERROR, {}),
    # A file the code names that is not part of a checkpoint's layout stays the code's.
    (
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'",
        "python_exception",
        C.USER_EXCEPTION,
        {"exception": "FileNotFoundError"},
    ),
    (
        "PermissionError: [Errno 13] Permission denied: '/checkpoints/run7/step_1000.pt'",
        "checkpoint_io",
        C.CHECKPOINT_IO_ERROR,
        {},
    ),
    (
        "RuntimeError: DataLoader worker (pid 12345) is killed by signal: Killed.",
        "dataloader_killed",
        C.DATALOADER_KILLED,
        {"signal": 9},
    ),
    (
        "RuntimeError: DataLoader worker (pid(s) 4011, 4012) exited unexpectedly",
        "dataloader_killed",
        C.DATALOADER_KILLED,
        {},
    ),
    (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step tasks have been OOM"
        " Killed.",
        "oom_kill",
        C.HOST_OOM,
        {"signal": 9},
    ),
    (
        "[1234567.890123] Memory cgroup out of memory: Killed process 4321 (python) total-vm:123456kB, anon-rss:1234kB",
        "oom_kill",
        C.HOST_OOM,
        {},
    ),
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to"
        " allocate 34359738368 bytes.",
        "oom_kill",
        C.HOST_OOM,
        {},
    ),
    ("Fatal Python error: Segmentation fault", "segfault", C.SEGFAULT, {"signal": 11}),
    (
        "[gpu-n1:12345:0:12345] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)",
        "segfault",
        C.SEGFAULT,
        {},
    ),
    ("*** SIGSEGV (@0x0) received by PID 1234 (TID 0x7f3a) from PID 0; stack trace: ***", "segfault", C.SEGFAULT, {}),
    (
        "[gpu-n1:12345 :0:12345] Caught signal 11 (Segmentation fault: invalid permissions for mapped object)",
        "segfault",
        C.SEGFAULT,
        {"host": "gpu-n1"},
    ),
    ("Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)", "segfault", C.SEGFAULT, {"signal": 11}),
    ("Fatal Python error: Bus error", "bus_error", C.BUS_ERROR, {"signal": 7}),
    ("RuntimeError: File /ckpt/run3/model_00050.pt cannot be opened.", "checkpoint_io", C.CHECKPOINT_IO_ERROR, {}),
    (
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x512 and 256x10)",
        "user_runtime_error",
        C.USER_EXCEPTION,
        {"exception": "RuntimeError"},
    ),
    (
        "RuntimeError: Error(s) in loading state_dict for GPT: size mismatch for wte.weight",
        "user_runtime_error",
        C.USER_EXCEPTION,
        {},
    ),
    (
        "KeyError: 'input_ids'",
        "python_exception",
        C.USER_EXCEPTION,
        {"exception": "KeyError", "message": "'input_ids'"},
    ),
    (
        "ModuleNotFoundError: No module named 'flash_attn'",
        "python_exception",
        C.USER_EXCEPTION,
        {"exception": "ModuleNotFoundError"},
    ),
    ("Fatal Python error: Aborted", "abort", C.SLURM_TASK_EXIT, {"signal": 6}),
    # --- communication ---
    (
        "[rank1]:[E1130 03:40:01.123456 1234 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:616] [Rank 1]"
        " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1,"
        " NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.",
        "nccl_watchdog_timeout",
        C.NCCL_TIMEOUT,
        {"rank": 1},
    ),
    (
        "[E ProcessGroupNCCL.cpp:475] [Rank 6] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2)",
        "nccl_watchdog_timeout",
        C.NCCL_TIMEOUT,
        {"rank": 6},
    ),
    (
        "[rank7]:[E ProcessGroupNCCL.cpp:1316] [PG 0 (default_pg) Rank 7] Heartbeat monitor timed out! Process will be"
        " terminated after dumping debug info. workMetaList_.size()=1",
        "nccl_heartbeat",
        C.NCCL_TIMEOUT,
        {"rank": 7},
    ),
    (
        "RuntimeError: [/opt/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out"
        " waiting 1800000ms for send operation to complete",
        "gloo_timeout",
        C.GLOO_ERROR,
        {},
    ),
    (
        "RuntimeError: [Rank 0]: Rank 3 failed to pass monitoredBarrier in 1800000 ms",
        "gloo_timeout",
        C.GLOO_ERROR,
        {"rank": 0, "peer_rank": 3},
    ),
    (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "nccl_remote_error",
        C.NCCL_ERROR,
        {},
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled"
        " system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
        "nccl_system_error",
        C.NCCL_ERROR,
        {},
    ),
    (
        "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0]"
        " via c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer",
        "nccl_init_failure",
        C.NCCL_ERROR,
        {"rank": 3, "peer_rank": 0},
    ),
    (
        "gpu-n2:1234:1290 [2] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.3<43561> failed :"
        " Software caused connection abort",
        "nccl_init_failure",
        C.NCCL_ERROR,
        {"host": "gpu-n2", "gpu": "2"},
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
        " [127.0.0.1]:12345",
        "peer_lost",
        C.GLOO_ERROR,
        {},
    ),
    (
        "RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, invalid"
        " argument, NCCL version 2.10.3",
        "nccl_error",
        C.NCCL_ERROR,
        {},
    ),
    (
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <="
        " op.nbytes. 8773632 vs 4194304",
        "gloo_error",
        C.GLOO_ERROR,
        {},
    ),
    ("RuntimeError: NCCL communicator was aborted on rank 2.", "nccl_aborted", C.NCCL_ERROR, {"rank": 2}),
    (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to connect to"
        " (10.0.0.1, 29500).",
        "c10d_error",
        C.NCCL_ERROR,
        {},
    ),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "c10d_error", C.NCCL_ERROR, {}),
    (
        "torch.distributed.DistBackendError: backend reported an unexpected state",
        "dist_backend_error",
        C.NCCL_ERROR,
        {},
    ),
    # --- launchers' summaries ---
    (
        "E0501 10:30:06.000000 140 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: 1)"
        " local_rank: 3 (pid: 1237) of binary: /usr/bin/python",
        "torchrun_failed",
        C.ELASTIC_CHILD_FAILED,
        {"exit_code": 1, "rank": None},
    ),
    (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 1 (pid: 4321) of"
        " binary: /usr/bin/python3",
        "torchrun_failed",
        C.SEGFAULT,
        {"exit_code": -11, "signal": 11},
    ),
    (
        "[2023-08-01 12:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py',"
        " '--local_rank=7'] exits with return code = -7",
        "launcher_exit",
        C.BUS_ERROR,
        {"exit_code": -7, "signal": 7},
    ),
    (
        "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' returned non-zero exit status 1.",
        "subprocess_failed",
        C.ELASTIC_CHILD_FAILED,
        {"exit_code": 1},
    ),
    ("Root Cause (first observed failure):", "elastic_root_cause", C.ELASTIC_CHILD_FAILED, {}),
    ("  exitcode  : -9 (pid: 1237)", "elastic_exitcode", C.ELASTIC_CHILD_FAILED, {"exit_code": -9, "signal": 9}),
    (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "torchrun_child_failed",
        C.ELASTIC_CHILD_FAILED,
        {},
    ),
    ("  traceback : Signal 9 (SIGKILL) received by PID 1237", "signal_received", C.ELASTIC_CHILD_FAILED, {"signal": 9}),
    (
        "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed                  python3 main.py --epochs 400",
        "shell_killed",
        C.SLURM_TASK_EXIT,
        {"signal": 9},
    ),
    (
        "2026-11-30T04:04:27.343Z [ERROR] rank=1/2 node=n2 step=7 fatal error (fault crash-1): exiting with code 13",
        "exit_code",
        C.SLURM_TASK_EXIT,
        {"rank": 1, "host": "n2", "exit_code": 13},
    ),
    (
        "Process 2 terminated with exit code 10, terminating remaining processes.",
        "exit_code",
        C.SLURM_TASK_EXIT,
        {"exit_code": 10},
    ),
    (
        "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
        "python_exception_other",
        C.USER_EXCEPTION,
        {"exception": "botocore.exceptions.NoCredentialsError"},
    ),
]


def _one(text: str) -> tuple[str, Category, dict[str, Any]]:
    prep = prepare(text)
    hit = match(prep.body)
    assert hit is not None, text
    return hit.signature.id, hit.category, extract(hit, prep)._asdict()


@pytest.mark.parametrize(
    ("text", "row", "category", "fields"), SIGNATURE_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(SIGNATURE_CASES)]
)
def test_row(text: str, row: str, category: Category, fields: dict[str, Any]) -> None:
    got_row, got_category, got = _one(text)
    assert (got_row, got_category) == (row, category)
    for name, value in fields.items():
        assert got[name] == value, name


def test_every_row_has_a_case() -> None:
    assert {row for _, row, _, _ in SIGNATURE_CASES} == {s.id for s in SIGNATURES}


def test_the_table() -> None:
    assert len({s.id for s in SIGNATURES}) == len(SIGNATURES)
    assert [s.priority for s in SIGNATURES] == sorted((s.priority for s in SIGNATURES), reverse=True)
    for s in SIGNATURES:
        # One truth for class and restartability: the category's (the catalogue refines XIDs per match).
        assert (s.failure_class, s.restartable) == CATEGORIES[s.category][:2], s.id
        assert s.role is not Role.CULPRIT or s.category is not C.NONE, s.id
    assert set(CATEGORIES) == set(Category)


PREFIXES = [
    ("", None),
    ("3: ", 3),
    ("[rank3]: ", 3),
    ("[rank3]:", 3),
    ("[default3]:", None),  # torchrun --tee: a local rank, never taken for the rank
    ("2024-05-01T10:00:00.123Z ", None),
    ("[2024-05-01 10:00:00,123] ", None),
    ("3: [rank3]: ", 3),
    ("[1,3]<stderr>:", 3),
    ("(RayTrainWorker pid=1234, ip=10.0.0.1) ", None),
    ("node-7: ", None),
    ("node-7: [rank3]: ", 3),
    ("2019-06-02T16:13:44.884Z: [1,3]<stdout>:", 3),
    ("Jul 13 21:22:34 ", None),
]


@pytest.mark.parametrize(("prefix", "rank"), PREFIXES)
def test_prefixes_do_not_change_the_verdict(prefix: str, rank: int | None) -> None:
    for message, row in [
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_address"),
        ("ValueError: Expected input batch_size (32) to match target batch_size (31).", "user_runtime_error"),
        ("KeyError: 'labels'", "python_exception"),
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "torchrun_child_failed"),
    ]:
        got_row, _, fields = _one(prefix + message)
        assert got_row == row, prefix + message
        assert fields["rank"] == rank
    assert _one("node-7: KeyError: 'labels'")[2]["host"] == "node-7"


@pytest.mark.parametrize(
    "text",
    [
        "gpu-n1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        "gpu-n1:1234:1290 [0] NCCL INFO transport/net.cc:1302 -> 6 [Proxy Thread] error",
        "gpu-n1:1234:1234 [0] NCCL WARN NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        "gpu-n1:1234:1234 [0] NCCL WARN Failed to open libibverbs.so[.1]",
        "NCCL version 2.18.1+cuda12.1",
        "[W ProcessGroupNCCL.cpp:1250] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect for point-to-point",
        "[rank0]:[W1130 03:40:01.123 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed"
        " before we destruct ProcessGroupNCCL.",
        "[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address.",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0",
        " iteration      100/  500000 | lm loss: 7.654321E+00 | loss scale: 65536.0 | grad norm: 1.234 | number of"
        " skipped iterations:   0 | number of nan iterations:   0 |",
        "Epoch 1: 100%|██████████| 10/10 [00:01<00:00, 9.5it/s, loss=0.123, v_num=0]",
        "{'loss': 1.6747, 'learning_rate': 0.0001956204379562044, 'epoch': 0.1}",
        "Search for `cudaErrorLaunchFailure' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
        " for more information.",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be"
        " incorrect.",
        "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 8"
        " worker processes in total.",
        "  warnings.warn(",
        "W0501 10:30:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 1236 closing"
        " signal SIGTERM",
        "wandb: Network error (ReadTimeout), entering retry loop.",
        "Saving checkpoint to /checkpoints/run7/step_1000.pt",
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3a>",
        "Traceback (most recent call last):",
        "| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |",
        "INFO: Reducer buckets have been rebuilt in this iteration.",
        "[812.0] task 1 (40511) exited with exit code 0.",  # slurmstepd: a task that finished cleanly
        "{'loss_cls': 0.4123, 'loss_bbox': 0.2211, 'loss': 0.6334, 'loss_scale': 65536.0}",
        "Loss is infeasible for this configuration, skipping",
        "requests: Max retry count exceeded, giving up on https://example.org/metrics",
        "Tried to allocate a new bucket for the gradient reducer",
        "[INFO] loss=0.5890 step_time=0.120s",
    ],
)
def test_chatter_is_not_a_failure(text: str) -> None:
    assert match(prepare(text).body) is None


def test_xid_catalogue_decides_category_role_and_restartability() -> None:
    def xid(n: int) -> Any:
        hit = match(f"NVRM: Xid (PCI:0000:3b:00): {n}, pid=1, name=python, message")
        assert hit is not None
        return hit

    fell, dbe, remap, unknown = xid(79), xid(48), xid(63), xid(999)
    assert (fell.category, fell.restartable, fell.role) == (C.GPU_FELL_OFF_BUS, True, Role.CULPRIT)
    assert "fallen off the bus" in fell.detail.lower()
    assert (dbe.category, dbe.failure_class, dbe.restartable) == (C.XID, CATEGORIES[C.XID].failure_class, True)
    assert "Double" in dbe.detail and "recommended" in dbe.detail
    # The catalogue calls 63 (a row remapping) informational: context, not a failure.
    assert (remap.category, remap.role, remap.restartable) == (C.NONE, Role.INFO, None)
    assert (unknown.category, unknown.detail) == (C.XID, "XID 999: not in the catalogue")


def test_an_exit_status_naming_sigsegv_or_sigbus_is_filed_under_that_signal() -> None:
    assert _one("failed (exitcode: -11) local_rank: 0")[1] is C.SEGFAULT
    assert _one("failed (exitcode: -7) local_rank: 0")[1] is C.BUS_ERROR
    assert _one("failed (exitcode: -9) local_rank: 0")[1] is C.ELASTIC_CHILD_FAILED
    assert _one("failed (exitcode: 1) local_rank: 0")[1] is C.ELASTIC_CHILD_FAILED
    assert _one("subprocess.CalledProcessError: Command 'x' died with <Signals.SIGSEGV: 11>.")[1] is C.SEGFAULT


def test_the_most_specific_row_wins_a_line() -> None:
    # The watchdog reports the CUDA error that killed it: the CUDA error is the news.
    watchdog = "[Rank 0] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was"
    assert _one(watchdog + " encountered")[0] == "cuda_illegal_address"
    # An aborted communicator whose reason was a timeout is a timeout.
    assert (
        _one(
            "RuntimeError: NCCL communicator was aborted on rank 2. Original reason for failure was: [Rank 2] Watchdog"
            " caught collective operation timeout: WorkNCCL(SeqNum=9)"
        )[1]
        is C.NCCL_TIMEOUT
    )
    assert _one("ValueError: Loss is NaN")[1] is C.NAN_LOSS
    assert _one("RuntimeError: DataLoader worker (pid 9) is killed by signal: Bus error.")[1] is C.BUS_ERROR


def test_an_exception_whose_message_starts_on_the_next_line_is_only_a_catch_all() -> None:
    # torch's driver check: raise AssertionError("""\nFound no NVIDIA driver on your system. ...""")
    for bare in ("AssertionError:", "[rank0]: AssertionError: ", "ValueError:"):
        hit = match(prepare(bare).body)
        assert hit is not None and (hit.signature.id, hit.signature.weak) == ("python_exception_other", True), bare
    # ... so the message's own row, on the next line, is the specific one that explains it
    nxt = match(prepare("Found no NVIDIA driver on your system. Please check that you").body)
    assert nxt is not None and nxt.category is C.CUDA_INIT_FAILURE and not nxt.signature.weak
    # a message on the same line, or no message at all, is still the program's own error
    assert _one("AssertionError: expected 3 channels")[0] == "python_exception"
    assert _one("KeyError")[0] == "python_exception"


# ----- hints: proved from each row's own regex -------------------------------------------------------------------


@pytest.mark.parametrize("sig", [s for s in SIGNATURES if s.hints], ids=lambda s: s.id)
def test_hints_are_sound(sig: Signature) -> None:
    """Every string the row's regex can match contains one of its hints, so skipping a line without one is safe."""
    assert all(h == h.lower() and h for h in sig.hints)
    assert proved(sig.pattern, sig.hints, fold=True), sig.id


def test_hints_found_in_one_pass_are_those_a_substring_test_finds() -> None:
    """``_hints_in`` (the trie search) against a plain substring test of every hint, on the repository's test logs
    and on lines made of hints that overlap and nest (``nccl warn``, ``cuda ``, a hint inside another)."""
    hints = sorted({h for s in SIGNATURES for h in s.hints})
    lines = [line.lower() for p in sorted(DATA.rglob("*.log")) for line in p.read_text(errors="replace").splitlines()]
    rng = random.Random(12)
    pieces = [*hints, " ", "x", "error", "rror", "nccl", "warn"]
    lines += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    for low in lines:
        assert _hints_in(low) == {h for h in hints if h in low}, low


def test_kinds_and_roles_stay_what_the_live_detector_reports() -> None:
    comm = {s.role for s in SIGNATURES if s.kind is FindingKind.COMM_ERROR}
    assert comm == {Role.VICTIM}
    assert {s.kind for s in SIGNATURES if s.category is C.USER_EXCEPTION} == {FindingKind.PYTHON_EXCEPTION}


def test_regexes_are_fast_on_long_junk() -> None:
    junk = "srun: error: n1: tasks 1-2,3" + " Connection " * 5000 + "CUDA error " * 5000 + "loss nan a.b." * 20000
    started = time.perf_counter()
    prep = prepare(junk)
    match(prep.body)
    assert time.perf_counter() - started < 2.0
    assert all(isinstance(s.pattern, re.Pattern) for s in SIGNATURES)


# Coloured error lines as loggers that think they write to a terminal leave them in the file Slurm writes. loguru's
# colorized format (loguru issues #26, #301: green time, level in its colour, cyan name:function:line, the message in
# the level's colour; ERROR is red + bold), rich's traceback (the exception type in bold red, numbers in the message
# highlighted in bold cyan), a C++ logger's 256-colour level (flexi_logger issue #33: ``\x1b[1;38;5;196mERROR``).
_GREEN, _CYAN, _RED, _BOLD, _RESET = "\x1b[32m", "\x1b[36m", "\x1b[31m", "\x1b[1m", "\x1b[0m"
COLOURED_CASES = [
    (
        f"3: {_GREEN}2024-05-01 10:00:00.103{_RESET} | {_RED}{_BOLD}ERROR   {_RESET} | {_CYAN}__main__{_RESET}:"
        f"{_CYAN}train{_RESET}:{_CYAN}42{_RESET} - {_RED}{_BOLD}torch.OutOfMemoryError: CUDA out of memory. Tried to "
        f"allocate 2.00 GiB. GPU 2 has a total capacity of 79.15 GiB{_RESET}",
        "cuda_oom",
        3,
    ),
    (
        "[rank5]: \x1b[1;31mtorch.AcceleratorError: \x1b[0mCUDA error: an illegal memory access was encountered",
        "cuda_illegal_address",
        5,
    ),
    (
        "\x1b[1;31mtorch.distributed.DistBackendError: \x1b[0mNCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:\x1b[1;36m275\x1b[0m, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version \x1b[1;36m2.20.5\x1b[0m",
        "nccl_system_error",
        None,
    ),
    (
        "\x1b[1;38;5;196mERROR\x1b[0m [trainer] \x1b[1;38;5;196mRuntimeError: CUDA error: misaligned address\x1b[0m",
        "cuda_illegal_address",
        None,
    ),
]


@pytest.mark.parametrize(("text", "row", "rank"), COLOURED_CASES, ids=[c[1] for c in COLOURED_CASES])
def test_coloured_lines_match_as_their_plain_text(text: str, row: str, rank: int | None) -> None:
    prep = prepare(text)
    assert "\x1b" not in prep.body
    hit = match(prep.body)
    assert hit is not None and hit.signature.id == row, text
    assert prep.rank == rank
    # The same line without colours reads the same: colours change nothing.
    plain = prepare(re.sub(r"\x1b\[[0-9;]*m", "", text))
    assert (plain.body, plain.rank) == (prep.body, prep.rank)
