"""Writes the attribution scenario suite (this directory) from the stories below.

Run ``python tests/data/attribution/generate.py [OUT_DIR]`` (default: this directory).

Each constructed scenario is a short story of one failed job, told in the message formats PyTorch, NCCL, gloo,
torchrun and srun really print (the README lists where each format comes from), with its ground truth. The lab
scenarios copy real captures from ``tests/data/logs/`` byte for byte. Running this again rewrites every scenario
directory it knows (and nothing else) with identical bytes: the text is deterministic.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from deploy.demo.common import log_line  # noqa: E402  (the demo trainer's own line format)
from deploy.demo.faults import cuda_error_message  # noqa: E402  (PyTorch's CUDA error text, by XID)

NODES = ("n1", "n2", "n3", "n4")
IP = {n: f"10.1.0.{i + 1}" for i, n in enumerate(("n1", "n2", "n3", "n4", "n5", "n6", "n7"))}
SITE = "/opt/conda/lib/python3.11/site-packages"
ECC, LAUNCH = 48, 79  # XIDs whose CUDA error text cuda_error_message prints (uncorrectable ECC, launch failure)


# ----- time and the stamps each tool prints ---------------------------------------------------------------------


def epoch(t: datetime) -> float:
    return t.timestamp()


def demo(t: datetime, level: str, rank: int, world: int, node: str, message: str) -> str:
    """The demo trainer's line (deploy/demo/common.log_line): ``2026-...Z [LEVEL] rank=R/W node=N message``."""
    return log_line(level, rank, world, node, message, now=epoch(t))


def hydra(t: datetime, level: str, message: str, logger: str = "__main__") -> str:
    """Python logging as Hydra configures it: ``[2026-12-03 10:02:11,412][__main__][INFO] - message``."""
    return f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}][{logger}][{level}] - {message}"


def elastic(t: datetime, level: str, message: str) -> str:
    """torchrun's agent (torch 2.1/2.2): ``[2026-12-03 13:05:22,118] torch.distributed.elastic...: [ERROR] ...``."""
    stamp = f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}]"
    return f"{stamp} torch.distributed.elastic.multiprocessing.api: [{level}] {message}"


def glog(t: datetime, level: str = "E") -> str:
    """c10's glog-style stamp: ``E1203 11:20:41.118213941`` (no year: log readers cannot place it in time)."""
    return f"{level}{t:%m%d %H:%M:%S}.{t.microsecond * 1000 + 213:09d}"


def batch_start(t: datetime, job: Job) -> str:
    """The first line of the demo's batch script (deploy/demo/train.sbatch)."""
    nodelist = f"n[1-{len(job.nodes)}]" if job.nodes == NODES[: len(job.nodes)] else ",".join(job.nodes)
    return (
        f"{demo_ts(t)} [INFO] batch job_id={job.id} restart=0 nodes={nodelist} ntasks={job.tasks} "
        f"batch_host={job.nodes[0]} gpus=0,1,2,3"
    )


def demo_ts(t: datetime) -> str:
    return demo(t, "X", 0, 1, "x", "").split(" ", 1)[0]


def task_list(ranks: Sequence[int]) -> str:
    """srun's task list: ``0-3``, ``8,10-11``."""
    parts: list[str] = []
    ranks = sorted(ranks)
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def srun_exits(job: Job, ranks: Iterable[int], status: str) -> list[str]:
    """srun's per-node verdict lines, ``srun: error: n1: tasks 0-3: Exited with exit code 1``."""
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(job.node_of(r), []).append(r)
    return [
        f"srun: error: {node}: task{'s' if len(rs) > 1 else ''} {task_list(rs)}: {status}"
        for node, rs in by_node.items()
    ]


# ----- a job -------------------------------------------------------------------------------------------------------


@dataclass
class Job:
    id: int
    t0: datetime
    nodes: tuple[str, ...] = NODES
    tasks: int = 16
    layout: str = "block"
    files: dict[str, list[str]] = field(default_factory=dict)

    def node_of(self, rank: int) -> str:
        if self.layout == "cyclic":
            return self.nodes[rank % len(self.nodes)]
        per = self.tasks // len(self.nodes)
        return self.nodes[rank // per]

    def local_rank(self, rank: int) -> int:
        if self.layout == "cyclic":
            return rank // len(self.nodes)
        return rank % (self.tasks // len(self.nodes))

    def at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def rank_file(self, rank: int, name: str = "job-{job}-rank-{rank}.log") -> list[str]:
        return self.files.setdefault(name.format(job=self.id, rank=rank, node=self.node_of(rank)), [])

    def batch(self) -> list[str]:
        return self.files.setdefault(f"job-{self.id}-batch.log", [])


def demo_prelude(job: Job, rank: int, steps: Sequence[int], rng: random.Random, backend: str = "nccl") -> list[str]:
    """A rank's start and a few step lines, as the demo trainer prints them (t in seconds from job.t0)."""
    node, w = job.node_of(rank), job.tasks
    lr = job.local_rank(rank)
    t = rng.uniform(0.0, 0.2)
    out = [
        demo(
            job.at(t),
            "INFO",
            rank,
            w,
            node,
            f"starting: job_id={job.id} restart=0 world_size={w} local_rank={lr} gpu={lr} pid={41000 + 37 * rank} "
            f"rendezvous={IP[job.nodes[0]]}:29500 steps=100000 checkpoint_every=200",
        ),
        demo(
            job.at(t + 1.9),
            "INFO",
            rank,
            w,
            node,
            f"process group ready: backend={backend} world_size={w} init_time=1.84s",
        ),
        demo(
            job.at(t + 2.4),
            "INFO",
            rank,
            w,
            node,
            f"resumed from checkpoint step_{steps[0] - 1:06d} (step {steps[0] - 1})",
        ),
    ]
    t += 3.0
    loss = 2.1 + rng.uniform(-0.05, 0.05)
    for step in steps:
        dt = 0.41 + rng.uniform(-0.02, 0.02)
        t += dt
        loss *= 0.9995
        out.append(
            demo(
                job.at(t),
                "INFO",
                rank,
                w,
                node,
                f"step={step} loss={loss:.4f} step_time={dt:.3f}s compute_time={dt - 0.09:.3f}s",
            )
        )
    return out


def hydra_prelude(job: Job, rank: int, steps: Sequence[int], rng: random.Random) -> list[str]:
    """A rank's start and step lines from a Hydra-configured trainer (no node in any line)."""
    t = rng.uniform(0.0, 0.2)
    out = [
        hydra(
            job.at(t),
            "INFO",
            f"rank {rank}/{job.tasks} local_rank {job.local_rank(rank)}: initializing process group (nccl)",
        ),
        hydra(job.at(t + 2.1), "INFO", f"loaded checkpoint /scratch/ckpt/step_{steps[0] - 1:06d}"),
    ]
    t += 3.0
    loss = 1.95 + rng.uniform(-0.05, 0.05)
    for step in steps:
        dt = 0.52 + rng.uniform(-0.02, 0.02)
        t += dt
        loss *= 0.9996
        out.append(hydra(job.at(t), "INFO", f"step {step} | loss {loss:.4f} | lr 2.4e-04 | {dt:.3f}s/it"))
    return out


STEPS = range(2201, 2206)  # the steps each prelude shows; the failure happens in step 2206
FAIL_AT = 3.0 + 5 * 0.41 + 0.6  # seconds from t0: just after the last step of a demo prelude


def py_traceback(frames: Sequence[tuple[str, int, str, str]]) -> list[str]:
    """``Traceback (most recent call last):`` and the frames, as CPython prints an uncaught exception."""
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        out += [f'  File "{path}", line {line}, in {func}', f"    {code}"]
    return out


ALLREDUCE_FRAMES = [
    ("/workspace/train.py", 231, "<module>", "main()"),
    ("/workspace/train.py", 204, "main", "loss = train_step(model, batch, optimizer)"),
    ("/workspace/train.py", 158, "train_step", "dist.all_reduce(flat, op=dist.ReduceOp.SUM)"),
    (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
    (f"{SITE}/torch/distributed/distributed_c10d.py", 2501, "all_reduce", "work.wait()"),
]
SYNC_FRAMES = [
    ("/workspace/train.py", 231, "<module>", "main()"),
    ("/workspace/train.py", 204, "main", "loss = train_step(model, batch, optimizer)"),
    ("/workspace/train.py", 161, "train_step", "loss_value = loss.item()"),
]


def gloo_peer_closed(peer: str, port: int) -> str:
    """gloo's error when the peer's socket closes (torch 2.x, as in the lab's demo-crash-rank-0.log)."""
    return (
        f"RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
        f"peer [{IP[peer]}]:{port}. This is typically caused by a remote worker crashing. Check the logs of the "
        "remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
    )


def nccl_remote_error(peer: str, port: int, prefix: str = "") -> list[str]:
    """What a survivor's collective raises when a peer process dies under NCCL's socket transport (torch 2.3+)."""
    return [
        f"{prefix}torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
        "remote process exited or there was a network error, NCCL version 2.21.5",
        f"{prefix}ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.",
        f"{prefix}Last error:",
        f"{prefix}socketProgressOpt: Call to recv from {IP[peer]}<{port}> failed : Connection reset by peer",
    ]


def cuda_traceback(xid: int, frames: Sequence[tuple[str, int, str, str]] = SYNC_FRAMES, prefix: str = "") -> list[str]:
    """PyTorch's uncaught CUDA error: the traceback, ``RuntimeError: CUDA error: ...`` and torch's hint lines."""
    text = cuda_error_message(xid).rstrip("\n").split("\n")
    return [prefix + line for line in [*py_traceback(frames), f"RuntimeError: {text[0]}", *text[1:]]]


def watchdog_timeout(t: datetime, rank: int, seq: int, ran_ms: int) -> list[str]:
    """ProcessGroupNCCL's watchdog on a timed-out allreduce, then the abort (torch 2.4, srun-launched rank)."""
    work = f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=25690112, NumelOut=25690112, Timeout(ms)=600000)"
    p = f"[rank{rank}]:"
    lib = f"{SITE}/torch/lib"
    return [
        f"{p}[{glog(t)} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: {work} "
        f"ran for {ran_ms} milliseconds before timing out.",
        f"{p}[{glog(t)} ProcessGroupNCCL.cpp:1785] [PG 0 (default_pg) Rank {rank}] Exception (either an error or "
        f"timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: "
        f"{seq - 1}.",
        f"{p}[{glog(t)} ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL operations have failed or timed out. Due to "
        "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{p}[{glog(t)} ProcessGroupNCCL.cpp:636] [Rank {rank}] To avoid data inconsistency, we are taking the entire "
        "process down.",
        f"{p}[{glog(t)} ProcessGroupNCCL.cpp:1595] [PG 0 (default_pg) Rank {rank}] Process group watchdog thread "
        f"terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: {work} ran for "
        f"{ran_ms} milliseconds before timing out.",
        "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent "
        "call first):",
        f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3b6d41df86 in {lib}/libc10.so)",
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        f"std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f3b6e71a8d2 in {lib}/libtorch_cuda.so)",
        f"frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f3b6e721313 in {lib}/libtorch_cuda.so)",
        f"frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c (0x7f3b6e7226fc in {lib}/libtorch_cuda.so)",
        "frame #4: <unknown function> + 0xd6df4 (0x7f3bca9d5df4 in /lib/x86_64-linux-gnu/libstdc++.so.6)",
        "frame #5: <unknown function> + 0x8609 (0x7f3c74f76609 in /lib/x86_64-linux-gnu/libpthread.so.0)",
        "frame #6: clone + 0x43 (0x7f3c750b0353 in /lib/x86_64-linux-gnu/libc.so.6)",
        "",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: [Rank "
        f"{rank}] Watchdog caught collective operation timeout: {work} ran for {ran_ms} milliseconds before timing "
        "out.",
    ]


FAULTHANDLER_SEGV = [
    "Fatal Python error: Segmentation fault",
    "",
    "Thread 0x00007f2a3dfff640 (most recent call first):",
    f'  File "{SITE}/torch/utils/data/_utils/pin_memory.py", line 54 in do_one_step',
    f'  File "{SITE}/torch/utils/data/_utils/pin_memory.py", line 70 in _pin_memory_loop',
    '  File "/opt/conda/lib/python3.11/threading.py", line 982 in run',
    "",
    "Current thread 0x00007f2b8c5e3740 (most recent call first):",
    f'  File "{SITE}/apex/normalization/fused_layer_norm.py", line 36 in forward',
    f'  File "{SITE}/torch/nn/modules/module.py", line 1562 in _call_impl',
    '  File "/workspace/model.py", line 118 in forward',
    '  File "/workspace/train.py", line 152 in train_step',
    '  File "/workspace/train.py", line 204 in main',
    '  File "/workspace/train.py", line 231 in <module>',
    "",
    "Extension modules: numpy.core._multiarray_umath, torch._C, torch._C._fft, torch._C._linalg, torch._C._nn, "
    "fused_layer_norm_cuda, amp_C (total: 7)",
]


# ----- the scenarios ----------------------------------------------------------------------------------------------


@dataclass
class Built:
    meta: dict[str, Any]
    files: dict[str, list[str]]


SCENARIOS: dict[str, Callable[[], Built]] = {}


def scenario(fn: Callable[[], Built]) -> Callable[[], Built]:
    SCENARIOS[fn.__name__.replace("_", "-")] = fn
    return fn


def meta(
    job: Job,
    title: str,
    truth: dict[str, Any],
    *,
    logs: Sequence[str] = ("job-%j-rank-%t.log", "job-%j-batch.log"),
    task_count: int | None = None,
    window_start: datetime | None = None,
    gpu_events: Sequence[dict[str, Any]] = (),
    nodes: dict[str, Any] | None = None,
    notes: str = "",
    launcher: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "title": title,
        "source": "constructed",
        "job_id": job.id,
        "job_nodes": list(job.nodes),
        "task_count": task_count or job.tasks,
        "layout": job.layout,
        **(launcher or {}),
        "logs": list(logs),
    }
    if window_start is not None:
        out["window_start"] = window_start.isoformat().replace("+00:00", "Z")
    if gpu_events:
        out["gpu_events"] = list(gpu_events)
    if nodes:
        out["nodes"] = nodes
    out["truth"] = truth
    if notes:
        out["notes"] = notes
    return out


def truth(culprits: Sequence[str], failure_class: str, retryable: bool, why: str) -> dict[str, Any]:
    return {"culprit_nodes": list(culprits), "failure_class": failure_class, "retryable": retryable, "why": why}


def stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def demo_job_with_victims(
    job: Job,
    rng: random.Random,
    culprit: int,
    culprit_lines: Callable[[datetime], list[str]],
    victim_delay: Callable[[int], float],
    victim_kind: str = "gloo",
) -> None:
    """Every rank's prelude; the culprit's lines at FAIL_AT; each other rank's victim error after its delay."""
    peer = job.node_of(culprit)
    for r in range(job.tasks):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng, backend=victim_kind)
        if r == culprit:
            lines += culprit_lines(job.at(FAIL_AT))
            continue
        t = job.at(FAIL_AT + victim_delay(r))
        node = job.node_of(r)
        if victim_kind == "gloo":
            error = gloo_peer_closed(peer, 47000 + culprit)
            lines.append(
                demo(t, "ERROR", r, job.tasks, node, f"step=2206 all_reduce failed: {error.split(': ', 1)[1]}")
            )
            lines += [*py_traceback(ALLREDUCE_FRAMES), error]
        else:
            error_lines = nccl_remote_error(peer, 35000 + culprit)
            lines.append(
                demo(t, "ERROR", r, job.tasks, node, "step=2206 all_reduce failed: " + error_lines[0].split(": ", 1)[1])
            )
            lines += [*py_traceback(ALLREDUCE_FRAMES), *error_lines]


@scenario
def cuda_ecc_victims_earlier_in_file() -> Built:
    rng = random.Random(1)
    job = Job(4101, datetime(2026, 12, 3, 9, 14, 0, tzinfo=UTC))

    def culprit(t: datetime) -> list[str]:
        text = cuda_error_message(ECC).split("\n")[0]
        return [demo(t, "ERROR", 9, 16, "n3", f"step=2206 RuntimeError: {text}"), *cuda_traceback(ECC)]

    # Rank 9's file sorts after every other rank's (rank-0, rank-1, rank-10 ... rank-15, rank-2 ... rank-8), yet its
    # error is the first in time: the victims' lines come 0.2 to 0.9 s later.
    demo_job_with_victims(job, rng, 9, culprit, lambda r: 0.2 + 0.05 * ((r * 7) % 15))
    b = job.batch()
    b.append(batch_start(job.at(-1.2), job))
    b.append(
        f"slurmstepd: error: *** STEP {job.id}.0 ON n1 CANCELLED AT {job.at(FAIL_AT + 1):%Y-%m-%dT%H:%M:%S} DUE TO "
        "TASK FAILURE ***"
    )
    b += srun_exits(job, [r for r in range(16) if r != 9], "Exited with exit code 1")
    b += [
        "srun: error: n3: task 9: Exited with exit code 1",
        f"srun: launch/slurm: _step_signal: Terminating StepId={job.id}.0",
    ]
    b.append(f"{demo_ts(job.at(FAIL_AT + 2.3))} [INFO] batch job_id={job.id} restart=0 srun exited with status 1")
    return Built(
        meta(
            job,
            "one rank's uncorrectable ECC error, 15 gloo victims whose files sort first but who failed later",
            truth(
                ["n3"],
                "hardware",
                True,
                "GPU 1 of n3 (rank 9) raised an uncorrectable ECC error; the other 15 ranks only lost their peer.",
            ),
        ),
        job.files,
    )


@scenario
def cuda_launch_failure_victims_earlier_in_time() -> Built:
    rng = random.Random(2)
    job = Job(4102, datetime(2026, 12, 3, 10, 2, 0, tzinfo=UTC))
    fail = job.at(3.0 + 5 * 0.52 + 0.5)
    for r in range(16):
        lines = job.rank_file(r)
        lines += hydra_prelude(job, r, STEPS, rng)
        if r == 1:
            # The kernel failed first, but a CUDA error surfaces at the next synchronising call: 1.4 s after the
            # peers' collectives broke.
            t = fail + timedelta(seconds=1.4)
            lines.append(hydra(t, "ERROR", "step 2206 failed: CUDA error: unspecified launch failure"))
            lines += cuda_traceback(LAUNCH)
            continue
        t = fail + timedelta(seconds=0.1 + 0.04 * r)
        errs = nccl_remote_error("n1", 35001)
        lines.append(hydra(t, "ERROR", "step 2206 failed: " + errs[0].split(": ", 1)[1]))
        lines += [*py_traceback(ALLREDUCE_FRAMES), *errs]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, [*range(8, 16), *range(4, 8), 0, 2, 3], "Exited with exit code 1")
    b.append("srun: error: n1: task 1: Exited with exit code 1")
    return Built(
        meta(
            job,
            "one rank's CUDA launch failure reported after its 15 NCCL victims (whose files sort later)",
            truth(
                ["n1"],
                "hardware",
                True,
                "rank 1's GPU on n1 failed a kernel launch (XID 79-style); NCCL peers saw the broken connection "
                "before rank 1's own CUDA call returned the error.",
            ),
        ),
        job.files,
    )


@scenario
def xid_79_one_node() -> Built:
    rng = random.Random(3)
    job = Job(4103, datetime(2026, 12, 3, 11, 0, 0, tzinfo=UTC))
    timeout = job.at(FAIL_AT + 600.05)
    for r in range(16):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng)
        if r != 6:  # rank 6 is stuck in the driver with its GPU gone: it prints nothing
            lines += watchdog_timeout(timeout + timedelta(milliseconds=17 * r), r, 48121, 600044 + r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, [r for r in range(16) if r != 6], "Aborted (core dumped)")
    b.append("srun: error: n2: task 6: Killed")
    event = {
        "kind": "xid",
        "host": "n2",
        "index": 2,
        "xid": 79,
        "source": "nvml",
        "observed_at": stamp(job.at(FAIL_AT)),
    }
    return Built(
        meta(
            job,
            "XID 79 on n2 (node agent), rank 6 silent, every other rank's NCCL watchdog times out and aborts",
            truth(
                ["n2"],
                "hardware",
                True,
                "GPU 2 of n2 fell off the bus (XID 79); rank 6 hung in the driver and the other 15 ranks timed out "
                "waiting for it.",
            ),
            gpu_events=[event],
        ),
        job.files,
    )


@scenario
def ecc_dbe_event_and_cuda_error() -> Built:
    rng = random.Random(4)
    job = Job(4104, datetime(2026, 12, 3, 11, 30, 0, tzinfo=UTC))

    def culprit(t: datetime) -> list[str]:
        return cuda_traceback(ECC)

    demo_job_with_victims(job, rng, 13, culprit, lambda r: 0.3 + 0.02 * r, victim_kind="nccl")
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(16), "Exited with exit code 1")
    event = {"kind": "ecc_dbe", "host": "n4", "index": 1, "source": "nvml", "observed_at": stamp(job.at(FAIL_AT + 0.2))}
    return Built(
        meta(
            job,
            "double-bit ECC event on n4 GPU 1 and rank 13's CUDA ECC error; NCCL victims elsewhere",
            truth(
                ["n4"],
                "hardware",
                True,
                "GPU 1 of n4 had a double-bit ECC error; rank 13 died of it, the others lost their peer.",
            ),
            gpu_events=[event],
        ),
        job.files,
    )


def dead_node_job(job: Job, rng: random.Random, dead: Sequence[str], blip: Sequence[str] = ()) -> datetime:
    """Every rank's prelude; the dead nodes' ranks then print nothing; the others lose their peer under NCCL."""
    dead_ranks = [r for r in range(job.tasks) if job.node_of(r) in dead]
    for r in range(job.tasks):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng)
        if r in dead_ranks:
            continue
        t = job.at(FAIL_AT + 0.3 + 0.03 * r)
        errs = nccl_remote_error(dead[0], 35000 + dead_ranks[0])
        lines.append(
            demo(t, "ERROR", r, job.tasks, job.node_of(r), "step=2206 all_reduce failed: " + errs[0].split(": ", 1)[1])
        )
        lines += [*py_traceback(ALLREDUCE_FRAMES), *errs]
    return job.at(FAIL_AT)


@scenario
def dead_node_not_responding() -> Built:
    rng = random.Random(5)
    job = Job(4105, datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC))
    window = dead_node_job(job, rng, ["n3"])
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, [r for r in range(16) if job.node_of(r) != "n3"], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "n3 stops answering (scheduler: NOT_RESPONDING), its ranks go silent, 12 peers report lost connections",
            truth(
                ["n3"],
                "infrastructure",
                True,
                "n3's kernel panicked: slurmd stopped answering and its four ranks died without a word.",
            ),
            window_start=window,
            nodes={"n3": {"state": "allocated", "flags": ["NOT_RESPONDING"]}},
        ),
        job.files,
    )


@scenario
def dead_node_and_neighbour_blip() -> Built:
    rng = random.Random(6)
    job = Job(4106, datetime(2026, 12, 3, 12, 30, 0, tzinfo=UTC))
    window = dead_node_job(job, rng, ["n2"])
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: Node failure on n2")
    b += srun_exits(job, [r for r in range(16) if job.node_of(r) != "n2"], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "n2 DOWN and silent; n4 NOT_RESPONDING for a moment but its ranks keep writing",
            truth(
                ["n2"],
                "infrastructure",
                True,
                "n2 lost power; slurmctld's pings to n4 timed out in the same round, but n4's ranks kept logging: it "
                "was alive.",
            ),
            window_start=window,
            nodes={
                "n2": {"state": "down", "flags": ["NOT_RESPONDING"]},
                "n4": {"state": "allocated", "flags": ["NOT_RESPONDING"]},
            },
        ),
        job.files,
    )


def watchdog_job(job: Job, rng: random.Random, skip: Sequence[int] = ()) -> None:
    timeout = job.at(FAIL_AT + 600.05)
    for r in range(job.tasks):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng)
        if r not in skip:
            lines += watchdog_timeout(timeout + timedelta(milliseconds=13 * r), r, 77310, 600031 + r)


@scenario
def nccl_watchdog_all_ranks_one_illegal_access() -> Built:
    rng = random.Random(7)
    job = Job(4107, datetime(2026, 12, 3, 13, 0, 0, tzinfo=UTC))
    watchdog_job(job, rng, skip=[6])
    t = job.at(FAIL_AT + 0.2)
    lib = f"{SITE}/torch/lib"
    job.rank_file(6).extend(
        [
            f"[rank6]:[{glog(t)} ProcessGroupNCCL.cpp:1595] [PG 0 (default_pg) Rank 6] Process group watchdog thread "
            "terminated with exception: CUDA error: an illegal memory access was encountered",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            "",
            "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 (most recent "
            "call first):",
            f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1e2b8f1f86 in {lib}/libc10.so)",
            "frame #1: c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&) + "
            f"0x64 (0x7f1e2b8a0d10 in {lib}/libc10.so)",
            "frame #2: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool) + 0x118 "
            f"(0x7f1e2b9ccf08 in {lib}/libc10_cuda.so)",
            "frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x56 (0x7f1e2cb1e3e6 "
            f"in {lib}/libtorch_cuda.so)",
            f"frame #4: c10d::ProcessGroupNCCL::watchdogHandler() + 0x1da (0x7f1e2cb2590a in {lib}/libtorch_cuda.so)",
            "",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            "  what():  [PG 0 (default_pg) Rank 6] Process group watchdog thread terminated with exception: CUDA "
            "error: an illegal memory access was encountered",
        ]
    )
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: n2: task 6: Aborted (core dumped)")
    b += srun_exits(job, [r for r in range(16) if r != 6], "Aborted (core dumped)")
    return Built(
        meta(
            job,
            "NCCL watchdog timeouts on 15 ranks, one rank's illegal memory access (its watchdog saw it first)",
            truth(
                ["n2"],
                "hardware",
                True,
                "rank 6's GPU (n2, GPU 2) faulted in a kernel; ten minutes later every peer's watchdog timed out "
                "waiting for it. One rank of 16 running the same code and data shapes: the GPU, not the code.",
            ),
        ),
        job.files,
    )


@scenario
def nccl_watchdog_all_ranks_storage_stall() -> Built:
    rng = random.Random(8)
    job = Job(4108, datetime(2026, 12, 3, 13, 30, 0, tzinfo=UTC))
    watchdog_job(job, rng, skip=[0])
    job.rank_file(0).append(
        demo(job.at(FAIL_AT - 0.3), "INFO", 0, 16, "n1", "saving checkpoint step_002205 to /lustre/proj/ckpt")
    )
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(1, 16), "Aborted (core dumped)")
    b.append("srun: error: n1: task 0: Terminated")
    b.append(f"srun: launch/slurm: _step_signal: Terminating StepId={job.id}.0")
    return Built(
        meta(
            job,
            "rank 0 blocked in a checkpoint write on a stalled /lustre; 15 ranks' watchdogs time out and abort",
            truth(
                [],
                "infrastructure",
                True,
                "the shared filesystem stalled for 12 minutes while rank 0 wrote a checkpoint; the others timed out "
                "in the next allreduce and aborted (SIGABRT is how a watchdog timeout ends). No node is at fault.",
            ),
            notes="Every rank that aborted did so because its watchdog timed out: an abort after a watchdog "
            "timeout is a victim's death, not a culprit's.",
        ),
        job.files,
    )


@scenario
def segfault_one_rank() -> Built:
    rng = random.Random(9)
    job = Job(4109, datetime(2026, 12, 3, 14, 0, 0, tzinfo=UTC))
    demo_job_with_victims(job, rng, 14, lambda t: list(FAULTHANDLER_SEGV), lambda r: 0.15 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: n4: task 14: Segmentation fault (core dumped)")
    b += srun_exits(job, [r for r in range(16) if r != 14], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "rank 14 segfaults in a fused CUDA extension (faulthandler stack), 15 gloo victims",
            truth(
                ["n4"],
                "unknown",
                True,
                "rank 14 on n4 died of SIGSEGV; the peers only lost their connection. A segfault is the node's or the "
                "code's: unknown class, worth one restart elsewhere.",
            ),
        ),
        job.files,
    )


@scenario
def host_oom_one_rank() -> Built:
    rng = random.Random(10)
    job = Job(4110, datetime(2026, 12, 3, 14, 30, 0, tzinfo=UTC))
    # The kernel's OOM killer ends rank 5 with SIGKILL: it prints nothing.
    demo_job_with_victims(job, rng, 5, lambda t: [], lambda r: 0.25 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append(
        f"slurmstepd: error: Detected 1 oom_kill event in StepId={job.id}.0. Some of the step tasks have been OOM "
        "Killed."
    )
    b.append("srun: error: n2: task 5: Out Of Memory")
    b += srun_exits(job, [r for r in range(16) if r != 5], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "rank 5 killed by the cgroup OOM killer (host memory), 15 gloo victims",
            truth(
                [],
                "user",
                False,
                "the job's dataloader workers on rank 5 outgrew the job's memory limit; the node is fine and the same "
                "job would be killed again on any node.",
            ),
        ),
        job.files,
    )


@scenario
def host_oom_srun_only() -> Built:
    rng = random.Random(27)
    job = Job(4127, datetime(2026, 12, 4, 1, 0, 0, tzinfo=UTC))
    demo_job_with_victims(job, rng, 5, lambda t: [], lambda r: 0.25 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    # Only srun's verdict names the OOM kill (as in the corpus's host_oom-05): no slurmstepd line before it.
    b.append("srun: error: n2: task 5: Out Of Memory")
    b += srun_exits(job, [r for r in range(16) if r != 5], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "rank 5 OOM-killed, named only by srun's 'n2: task 5: Out Of Memory'; 15 gloo victims",
            truth(
                [],
                "user",
                False,
                "rank 5's process outgrew the job's memory limit on n2; the node is fine and the job would be killed "
                "the same way anywhere.",
            ),
        ),
        job.files,
    )


USER_BUG = (
    "ValueError: shape mismatch: expected inputs of shape [batch, 4096] and matching targets, "
    "got inputs [8, 4095] and targets [8, 1]"
)
USER_FRAMES = [
    ("/workspace/train.py", 231, "<module>", "main()"),
    ("/workspace/train.py", 198, "main", "check_batch(x, y)"),
    ("/workspace/train.py", 121, "check_batch", "raise ValueError("),
]


@scenario
def user_bug_all_ranks() -> Built:
    rng = random.Random(11)
    job = Job(4111, datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC))
    for r in range(16):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng)
        lines += [*py_traceback(USER_FRAMES), USER_BUG]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(16), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "the same ValueError from the training code on all 16 ranks",
            truth([], "user", False, "a preprocessing change produced 4095 features; every rank's own check raised."),
        ),
        job.files,
    )


@scenario
def user_bug_one_rank() -> Built:
    rng = random.Random(12)
    job = Job(4112, datetime(2026, 12, 3, 15, 30, 0, tzinfo=UTC))
    frames = [
        ("/workspace/train.py", 231, "<module>", "main()"),
        ("/workspace/train.py", 196, "main", "batch = next(loader)"),
        (f"{SITE}/torch/utils/data/dataloader.py", 701, "__next__", "data = self._next_data()"),
        ("/workspace/data.py", 88, "collate", 'masks = torch.stack([s["attention_mask"] for s in samples])'),
        ("/workspace/data.py", 88, "<listcomp>", 'masks = torch.stack([s["attention_mask"] for s in samples])'),
    ]

    def culprit(t: datetime) -> list[str]:
        return [*py_traceback(frames), "KeyError: 'attention_mask'"]

    demo_job_with_victims(job, rng, 11, culprit, lambda r: 0.2 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(16), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "one rank's KeyError from its data shard (a malformed sample), 15 gloo victims",
            truth(
                [],
                "user",
                False,
                "one sample in rank 11's shard lacks an attention mask: a data bug that follows the shard to any node.",
            ),
        ),
        job.files,
    )


def torchrun_job(job: Job, rng: random.Random) -> dict[str, list[str]]:
    """One torchrun per node (srun --ntasks-per-node=1), its 4 workers' output prefixed ``[rankN]:``."""
    files: dict[str, list[str]] = {}
    for i, node in enumerate(job.nodes):
        lines = files.setdefault(f"job-{job.id}-node-{node}.log", [])
        t = job.at(rng.uniform(0, 0.3))
        run = f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}] torch.distributed.run: [WARNING] "
        lines += [
            run,
            run + "*****************************************",
            run + "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
            "system being overloaded, please further tune the variable for optimal performance in your application "
            "as needed.",
            run + "*****************************************",
        ]
        lines += [
            f"[rank{4 * i + lr}]: rank {4 * i + lr} (local {lr}) on {node}: world size 16, backend nccl"
            for lr in range(4)
        ]
        if node == job.nodes[0]:
            lines += [
                f"[rank0]: step {step} loss {1.8 - 0.0004 * step:.4f} tokens/s {41233 + 7 * step % 300}"
                for step in STEPS
            ]
    return files


def child_failed(t: datetime, node: str, rank: int, local: int, pid: int, exitcode: int, trace: str) -> list[str]:
    """torchrun's ChildFailedError summary (torch 2.x), printed by the agent that lost a worker."""
    return [
        "Traceback (most recent call last):",
        '  File "/opt/conda/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        f'  File "{SITE}/torch/distributed/run.py", line 879, in main',
        "    run(args)",
        f'  File "{SITE}/torch/distributed/launcher/api.py", line 263, in launch_agent',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "/workspace/train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        f"[{local}]:",
        f"  time      : {t:%Y-%m-%d_%H:%M:%S}",
        f"  host      : {node}",
        f"  rank      : {rank} (local_rank: {local})",
        f"  exitcode  : {exitcode} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {trace}",
        "============================================================",
    ]


#: One torchrun per node under srun: 4 Slurm tasks, 16 ranks (the live facts: srun's layout of the 4 tasks).
TORCHRUN_16 = {"launcher": "torchrun", "world_size": 16}


def torchrun_one_file(job: Job, rng: random.Random, label: bool) -> list[str]:
    """torchrun under ``srun --ntasks-per-node=1 [--label]`` writing only ``slurm-%j.out``: rank 2 (the first
    node's third worker) hits an uncorrectable ECC error; everyone else loses a peer; each agent reports."""
    files = torchrun_job(job, rng)
    out: list[str] = [batch_start(job.at(-1.0), job)]
    fail = job.at(8.0)
    for i, node in enumerate(job.nodes):
        task = f"{i}: " if label else ""
        body = files[f"job-{job.id}-node-{node}.log"]
        for lr in range(4):
            r = 4 * i + lr
            if r == 2:
                body += cuda_traceback(ECC, prefix="[rank2]: ")
            else:
                body += [f"[rank{r}]: " + ln for ln in [*py_traceback(ALLREDUCE_FRAMES), *nccl_remote_error("n1", 1)]]
        t = fail + timedelta(seconds=0.4 if i == 0 else 1.1 + 0.1 * i)
        pid = 71000 + 100 * i
        first = 2 if i == 0 else 0
        body.append(
            elastic(
                t,
                "ERROR",
                f"failed (exitcode: 1) local_rank: {first} (pid: {pid + first}) of binary: /opt/conda/bin/python3.11",
            )
        )
        out += [task + line for line in body]
    out += [f"srun: error: {node}: task {i}: Exited with exit code 1" for i, node in enumerate(job.nodes)]
    return out


@scenario
def torchrun_srun_label_one_file() -> Built:
    rng = random.Random(41)
    job = Job(4141, datetime(2026, 12, 4, 9, 0, 0, tzinfo=UTC))
    return Built(
        meta(
            job,
            "torchrun under srun --label, one slurm-%j.out: rank 2 (first node) has an uncorrectable ECC error",
            truth(
                ["n1"],
                "hardware",
                True,
                "rank 2 is the first node's third worker; its line carries srun's label 0 (the first node's task) and "
                "torchrun's [rank2]: prefix. The block layout over the 4 srun tasks put 'rank 2' on n3.",
            ),
            logs=["slurm-%j.out"],
            task_count=4,
            launcher=TORCHRUN_16,
            notes="Issue 11: the label is the Slurm task (the node), the [rankN]: prefix the rank; srun's layout of "
            "the 4 tasks places the label.",
        ),
        {f"slurm-{job.id}.out": torchrun_one_file(job, rng, label=True)},
    )


@scenario
def torchrun_rank_prefix_one_file() -> Built:
    rng = random.Random(42)
    job = Job(4142, datetime(2026, 12, 4, 10, 0, 0, tzinfo=UTC))
    return Built(
        meta(
            job,
            "torchrun under srun without --label, one slurm-%j.out: rank 2 (first node) has an uncorrectable ECC "
            "error; the node agents saw every rank's process",
            truth(
                ["n1"],
                "hardware",
                True,
                "only torchrun's [rank2]: prefix names the rank; the node agents' view of the processes (RANK, "
                "SLURMD_NODENAME) places it on n1. The block layout over the 4 srun tasks put it on n3.",
            ),
            logs=["slurm-%j.out"],
            task_count=4,
            launcher={**TORCHRUN_16, "rank_facts": "processes"},
            notes="Issue 11: the healthy n3 was drained at confidence 0.8 before rank -> node came from facts.",
        ),
        {f"slurm-{job.id}.out": torchrun_one_file(job, rng, label=False)},
    )


@scenario
def torchrun_cuda_ecc() -> Built:
    rng = random.Random(13)
    job = Job(4113, datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC))
    files = torchrun_job(job, rng)
    fail = job.at(8.0)
    for i, node in enumerate(job.nodes):
        lines = files[f"job-{job.id}-node-{node}.log"]
        for lr in range(4):
            r = 4 * i + lr
            if r == 10:
                lines += cuda_traceback(ECC, prefix="[rank10]: ")
            else:
                lines += [
                    f"[rank{r}]: " + ln for ln in [*py_traceback(ALLREDUCE_FRAMES), *nccl_remote_error("n3", 35010)]
                ]
        t = fail + timedelta(seconds=0.4 if node == "n3" else 1.1 + 0.1 * i)
        pid = 52000 + 100 * i
        for lr in range(4):
            if not (node == "n3" and lr == 2):
                lines.append(elastic(t, "WARNING", f"Sending process {pid + lr} closing signal SIGTERM"))
        first = 2 if node == "n3" else 0
        lines.append(
            elastic(
                t,
                "ERROR",
                f"failed (exitcode: 1) local_rank: {first} (pid: {pid + first}) of binary: /opt/conda/bin/python3.11",
            )
        )
        lines += child_failed(
            t,
            node,
            4 * i + first,
            first,
            pid + first,
            1,
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        )
    b = files.setdefault(f"job-{job.id}-batch.log", [])
    b.append(batch_start(job.at(-1.0), job))
    b += [f"srun: error: {node}: task {i}: Exited with exit code 1" for i, node in enumerate(job.nodes)]
    return Built(
        meta(
            job,
            "torchrun (4 workers per node, one file per node via %N): rank 10's uncorrectable ECC error",
            truth(
                ["n3"],
                "hardware",
                True,
                "GPU 2 of n3 (rank 10) had an uncorrectable ECC error; the other workers lost their peer and every "
                "agent reported a failed child.",
            ),
            logs=["job-%j-node-%N.log", "job-%j-batch.log"],
            task_count=4,
            launcher=TORCHRUN_16,
            notes="Slurm sees 4 tasks (one torchrun per node); the 16 ranks are torchrun's, so the block layout "
            "over 4 tasks knows no rank above 3: the node comes from %N.",
        ),
        files,
    )


@scenario
def torchrun_segfault_agent_lines() -> Built:
    rng = random.Random(14)
    job = Job(4114, datetime(2026, 12, 3, 17, 0, 0, tzinfo=UTC))
    files = torchrun_job(job, rng)
    fail = job.at(8.0)
    for i, node in enumerate(job.nodes):
        lines = files[f"job-{job.id}-node-{node}.log"]
        pid = 61800 + 100 * i
        if node == "n2":
            # Worker 1 (rank 5) dies of SIGSEGV without a word (faulthandler off); its agent notices at once.
            t = fail + timedelta(seconds=0.1)
            for lr in (0, 2, 3):
                lines.append(elastic(t, "WARNING", f"Sending process {pid + lr} closing signal SIGTERM"))
            lines.append(
                elastic(
                    t,
                    "ERROR",
                    f"failed (exitcode: -11) local_rank: 1 (pid: {pid + 1}) of binary: /opt/conda/bin/python3.11",
                )
            )
            lines += child_failed(t, node, 5, 1, pid + 1, -11, f"Signal 11 (SIGSEGV) received by PID {pid + 1}")
            continue
        for lr in range(4):
            r = 4 * i + lr
            lines += [f"[rank{r}]: " + ln for ln in [*py_traceback(ALLREDUCE_FRAMES), *nccl_remote_error("n2", 35005)]]
        # The survivors' agents report their own failed children 1.8 to 2.6 s later: n1's file sorts first.
        t = fail + timedelta(seconds=1.8 + 0.4 * (i // 2) + 0.1 * i)
        for lr in range(1, 4):
            lines.append(elastic(t, "WARNING", f"Sending process {pid + lr} closing signal SIGTERM"))
        lines.append(
            elastic(t, "ERROR", f"failed (exitcode: 1) local_rank: 0 (pid: {pid}) of binary: /opt/conda/bin/python3.11")
        )
        lines += child_failed(
            t, node, 4 * i, 0, pid, 1, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        )
    b = files.setdefault(f"job-{job.id}-batch.log", [])
    b.append(batch_start(job.at(-1.0), job))
    b += [f"srun: error: {node}: task {i}: Exited with exit code 1" for i, node in enumerate(job.nodes)]
    return Built(
        meta(
            job,
            "torchrun: rank 5 dies of SIGSEGV silently; n2's agent reports it first, the other agents (n1's file "
            "sorts first) later",
            truth(
                ["n2"],
                "unknown",
                True,
                "rank 5 on n2 segfaulted; the agents of n1, n3 and n4 only report children that lost their peer, 2 s "
                "later.",
            ),
            logs=["job-%j-node-%N.log", "job-%j-batch.log"],
            task_count=4,
            launcher=TORCHRUN_16,
        ),
        files,
    )


@scenario
def srun_label_one_file() -> Built:
    rng = random.Random(15)
    job = Job(4115, datetime(2026, 12, 3, 18, 0, 0, tzinfo=UTC))
    out: list[str] = [batch_start(job.at(-1.0), job)]
    preludes = {r: hydra_prelude(job, r, STEPS, rng) for r in range(16)}
    # srun --label interleaves the ranks' lines in one file, each prefixed with its task id.
    for i in range(max(len(p) for p in preludes.values())):
        for r in range(16):
            if i < len(preludes[r]):
                out.append(f"{r:2d}: {preludes[r][i]}")
    crash = cuda_traceback(LAUNCH)
    victims = {r: [*py_traceback(ALLREDUCE_FRAMES), *nccl_remote_error("n4", 35013)] for r in range(16) if r != 13}
    out += [f"13: {ln}" for ln in crash[:4]]
    for r in sorted(victims):
        out += [f"{r:2d}: {ln}" for ln in victims[r][:6]]
    out += [f"13: {ln}" for ln in crash[4:]]
    for r in sorted(victims):
        out += [f"{r:2d}: {ln}" for ln in victims[r][6:]]
    out += srun_exits(job, range(16), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "srun --label: all 16 ranks interleaved in one file; rank 13's CUDA launch failure",
            truth(["n4"], "hardware", True, "rank 13's GPU on n4 failed a kernel launch; the others lost their peer."),
            logs=["slurm-%j.out"],
        ),
        {f"slurm-{job.id}.out": out},
    )


def cyclic_ecc_job(job: Job, rng: random.Random, name: str) -> None:
    for r in range(16):
        lines = job.rank_file(r, name)
        lines += hydra_prelude(job, r, STEPS, rng)
        t = job.at(3.0 + 5 * 0.52 + 0.5)
        if r == 6:
            lines.append(hydra(t, "ERROR", "step 2206 failed: CUDA error: uncorrectable ECC error encountered"))
            lines += cuda_traceback(ECC)
        else:
            errs = nccl_remote_error("n3", 35006)
            lines.append(
                hydra(t + timedelta(seconds=0.2 + 0.02 * r), "ERROR", "step 2206 failed: " + errs[0].split(": ", 1)[1])
            )
            lines += [*py_traceback(ALLREDUCE_FRAMES), *errs]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: n3: task 6: Exited with exit code 1")
    b += srun_exits(job, [r for r in range(16) if r != 6], "Exited with exit code 1")


@scenario
def cyclic_layout_node_in_filename() -> Built:
    rng = random.Random(16)
    job = Job(4116, datetime(2026, 12, 3, 19, 0, 0, tzinfo=UTC), layout="cyclic")
    cyclic_ecc_job(job, rng, "job-{job}-{node}-rank-{rank}.log")
    return Built(
        meta(
            job,
            "srun --distribution=cyclic, files named with %N: rank 6 (on n3) has an uncorrectable ECC error",
            truth(
                ["n3"],
                "hardware",
                True,
                "cyclic placement puts rank 6 on n3 (6 mod 4 = 2); its GPU failed. The block layout would say n2.",
            ),
            logs=["job-%j-%N-rank-%t.log", "job-%j-batch.log"],
        ),
        job.files,
    )


@scenario
def cyclic_layout_rank_only() -> Built:
    rng = random.Random(17)
    job = Job(4117, datetime(2026, 12, 3, 19, 30, 0, tzinfo=UTC), layout="cyclic")
    cyclic_ecc_job(job, rng, "job-{job}-rank-{rank}.log")
    return Built(
        meta(
            job,
            "srun --distribution=cyclic, files named by rank only: rank 6 (on n3) has an uncorrectable ECC error",
            truth(
                ["n3"],
                "hardware",
                True,
                'cyclic placement puts rank 6 on n3; only srun\'s summary names the node ("n3: task 6"). The block '
                "layout maps rank 6 to n2, a healthy node.",
            ),
            notes="Exposes the block-layout assumption: the live activity builds rank -> node with srun's "
            "default block distribution.",
        ),
        job.files,
    )


@scenario
def silent_node_unconfirmed() -> Built:
    rng = random.Random(18)
    job = Job(4118, datetime(2026, 12, 3, 20, 0, 0, tzinfo=UTC))
    window = dead_node_job(job, rng, ["n4"])
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(12), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "victims only: n4's four ranks went silent, the scheduler still shows n4 responding",
            truth(
                ["n4"],
                "infrastructure",
                True,
                "n4's bonded uplink went down: its ranks could reach no one, and slurmctld would mark it "
                "NOT_RESPONDING only after SlurmdTimeout (300 s), after the attribution window.",
            ),
            window_start=window,
            notes="The policy deliberately implicates no node on silence alone (it waits for the scheduler): "
            "a top-1 miss by design, never a healthy drain.",
        ),
        job.files,
    )


@scenario
def two_gpu_failures_two_nodes() -> Built:
    rng = random.Random(19)
    job = Job(4119, datetime(2026, 12, 3, 20, 30, 0, tzinfo=UTC))
    for r in range(16):
        lines = job.rank_file(r)
        lines += demo_prelude(job, r, STEPS, rng)
        node = job.node_of(r)
        if r in (2, 13):
            xid = ECC if r == 2 else LAUNCH
            t = job.at(FAIL_AT + (0.0 if r == 2 else 0.05))
            lines.append(
                demo(t, "ERROR", r, 16, node, "step=2206 RuntimeError: " + cuda_error_message(xid).split("\n")[0])
            )
            lines += cuda_traceback(xid)
        else:
            errs = nccl_remote_error("n1", 35002)
            lines.append(
                demo(
                    job.at(FAIL_AT + 0.3 + 0.02 * r),
                    "ERROR",
                    r,
                    16,
                    node,
                    "step=2206 all_reduce failed: " + errs[0].split(": ", 1)[1],
                )
            )
            lines += [*py_traceback(ALLREDUCE_FRAMES), *errs]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(16), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "two GPUs fail 50 ms apart on different nodes: rank 2's ECC error (n1), rank 13's launch failure (n4)",
            truth(
                ["n1", "n4"],
                "hardware",
                True,
                "two independent GPU faults in the same step; both nodes are at fault, any of them is a right first "
                "answer and neither of the others may be drained.",
            ),
        ),
        job.files,
    )


@scenario
def two_nodes_lost() -> Built:
    rng = random.Random(20)
    job = Job(4120, datetime(2026, 12, 3, 21, 0, 0, tzinfo=UTC))
    window = dead_node_job(job, rng, ["n2", "n3"])
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += ["srun: error: Node failure on n2", "srun: error: Node failure on n3"]
    b += srun_exits(job, [*range(4), *range(12, 16)], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "a PDU trips: n2 and n3 both DOWN, their ranks silent, srun reports both node failures",
            truth(
                ["n2", "n3"],
                "infrastructure",
                True,
                "one power distribution unit fed n2 and n3; both went down together.",
            ),
            window_start=window,
            nodes={n: {"state": "down", "flags": ["NOT_RESPONDING"]} for n in ("n2", "n3")},
        ),
        job.files,
    )


@scenario
def node_failure_named_only_by_srun() -> Built:
    rng = random.Random(21)
    job = Job(4121, datetime(2026, 12, 3, 21, 30, 0, tzinfo=UTC))
    fail = job.at(3.0 + 5 * 0.52 + 0.5)
    for r in range(16):
        lines = job.rank_file(r)
        lines += hydra_prelude(job, r, STEPS, rng)
        if job.node_of(r) == "n2":
            continue
        errs = nccl_remote_error("n2", 35004)
        lines.append(
            hydra(fail + timedelta(seconds=0.3 + 0.02 * r), "ERROR", "step 2206 failed: " + errs[0].split(": ", 1)[1])
        )
        lines += [*py_traceback(ALLREDUCE_FRAMES), *errs]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append(
        f"slurmstepd: error: *** STEP {job.id}.0 ON n1 CANCELLED AT {fail + timedelta(seconds=31):%Y-%m-%dT%H:%M:%S} "
        "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    )
    b.append("srun: error: Node failure on n2")
    b += srun_exits(job, [r for r in range(16) if job.node_of(r) != "n2"], "Terminated")
    b.append("srun: Force Terminated StepId=4121.0")
    return Built(
        meta(
            job,
            "a node failure named only by srun's summary; the ranks' logs name no node, n2 is back in service",
            truth(
                ["n2"],
                "infrastructure",
                True,
                "n2 rebooted under the job (hardware watchdog); by the time the scheduler was read it had "
                're-registered, so only srun\'s "Node failure on n2" names it. The slurmstepd line is from survivor '
                "n1.",
            ),
            window_start=fail,
            nodes={"n2": {"state": "idle"}},
        ),
        job.files,
    )


@scenario
def segfault_srun_only_cyclic() -> Built:
    rng = random.Random(22)
    job = Job(4122, datetime(2026, 12, 3, 22, 0, 0, tzinfo=UTC), layout="cyclic")
    # Rank 9 (cyclic: n2) segfaults with faulthandler off: it prints nothing; srun names its node.
    demo_job_with_victims(job, rng, 9, lambda t: [], lambda r: 0.2 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: n2: task 9: Segmentation fault (core dumped)")
    b += srun_exits(job, [r for r in range(16) if r != 9], "Exited with exit code 1")
    return Built(
        meta(
            job,
            "cyclic layout; rank 9 segfaults silently, srun's summary names n2 (block layout would say n3)",
            truth(
                ["n2"],
                "unknown",
                True,
                "rank 9 runs on n2 under cyclic placement and died of SIGSEGV; srun's line names the node itself.",
            ),
        ),
        job.files,
    )


@scenario
def stragglers_only() -> Built:
    rng = random.Random(23)
    job = Job(4123, datetime(2026, 12, 3, 22, 30, 0, tzinfo=UTC))
    for r in range(16):
        lines = job.rank_file(r)
        node, t = job.node_of(r), rng.uniform(0, 0.2)
        lines.append(
            demo(
                job.at(t),
                "INFO",
                r,
                16,
                node,
                f"starting: job_id={job.id} restart=0 world_size=16 local_rank={r % 4} gpu={r % 4} pid={43000 + r} "
                f"rendezvous={IP['n1']}:29500 steps=100000 checkpoint_every=200",
            )
        )
        t += 3.0
        for step in range(3001, 3041):
            # Rank 10's GPU throttles (n3's fans): its compute takes 2.1x as long; the others wait for it each step.
            compute = 0.31 * (2.1 if r == 10 else 1.0) + rng.uniform(-0.01, 0.01)
            dt = 0.31 * 2.1 + 0.09 + rng.uniform(-0.01, 0.01)
            t += dt
            lines.append(
                demo(
                    job.at(t),
                    "INFO",
                    r,
                    16,
                    node,
                    f"step={step} loss={1.7 - 0.0001 * step:.4f} step_time={dt:.3f}s compute_time={compute:.3f}s",
                )
            )
    job.batch().append(batch_start(job.at(-1.0), job))
    return Built(
        meta(
            job,
            "no crash: rank 10 (n3) computes 2.1x slower and holds every step back",
            truth(
                [],
                "unknown",
                True,
                "a straggler is the straggler policy's business (a report, maybe a requeue), not attribution's: "
                "nothing failed, so no node may be drained on this evidence.",
            ),
        ),
        job.files,
    )


@scenario
def gpu_event_from_another_node() -> Built:
    rng = random.Random(24)
    job = Job(4124, datetime(2026, 12, 3, 23, 0, 0, tzinfo=UTC))

    def culprit(t: datetime) -> list[str]:
        return [
            demo(
                t,
                "ERROR",
                5,
                16,
                "n2",
                "step=2206 fatal error (optimizer state inconsistent after skip): exiting with code 13",
            )
        ]

    demo_job_with_victims(job, rng, 5, culprit, lambda r: 0.1 + 0.02 * r)
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b.append("srun: error: n2: task 5: Exited with exit code 13")
    b += srun_exits(job, [r for r in range(16) if r != 5], "Exited with exit code 1")
    event = {
        "kind": "xid",
        "host": "n7",
        "index": 0,
        "xid": 79,
        "source": "dcgm",
        "observed_at": stamp(job.at(FAIL_AT - 0.5)),
    }
    return Built(
        meta(
            job,
            "rank 5 exits 13 on n2; an XID 79 arrives at the same moment from n7, which is not in the job",
            truth(
                ["n2"],
                "unknown",
                True,
                "rank 5 on n2 ended itself; the XID belongs to another job's node and says nothing about this one.",
            ),
            gpu_events=[event],
        ),
        job.files,
    )


@scenario
def mixed_timestamps() -> Built:
    rng = random.Random(25)
    job = Job(4125, datetime(2026, 12, 4, 0, 0, 0, tzinfo=UTC))
    for r in range(16):
        lines = job.rank_file(r)
        node = job.node_of(r)
        if node in ("n1", "n2"):  # these ranks log through the trainer's logger: timestamped
            lines += demo_prelude(job, r, STEPS, rng, backend="gloo")
            t = job.at(FAIL_AT + 0.2 + 0.02 * r)
            error = gloo_peer_closed("n3", 47010)
            lines.append(demo(t, "ERROR", r, 16, node, f"step=2206 all_reduce failed: {error.split(': ', 1)[1]}"))
            lines.append(
                demo(t + timedelta(milliseconds=3), "ERROR", r, 16, node, "step=2206 fatal error: exiting with code 1")
            )
        else:  # n3 and n4 run an older build that prints plain lines: no time at all
            lines += [f"rank {r}: step {s} loss {2.1 - 0.0001 * s:.4f}" for s in STEPS]
            if r == 10:
                lines += list(FAULTHANDLER_SEGV)
            else:
                lines += [*py_traceback(ALLREDUCE_FRAMES), gloo_peer_closed("n3", 47010)]
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, [r for r in range(16) if r != 10], "Exited with exit code 1")
    b.append("srun: error: n3: task 10: Segmentation fault (core dumped)")
    return Built(
        meta(
            job,
            "mixed: n1/n2 ranks timestamped (and log their own exit 1), n3/n4 ranks unstamped; rank 10 segfaults",
            truth(
                ["n3"],
                "unknown",
                True,
                'rank 10 on n3 segfaulted without a timestamp; the stamped "exiting with code 1" lines on n1 and n2 '
                "come from ranks that had just lost their peer.",
            ),
        ),
        job.files,
    )


@scenario
def cuda_oom_one_rank() -> Built:
    rng = random.Random(26)
    job = Job(4126, datetime(2026, 12, 4, 0, 30, 0, tzinfo=UTC))
    frames = [
        ("/workspace/train.py", 231, "<module>", "main()"),
        ("/workspace/train.py", 204, "main", "loss = train_step(model, batch, optimizer)"),
        ("/workspace/train.py", 149, "train_step", "logits = model(batch)"),
        ("/workspace/model.py", 96, "forward", "attn = torch.softmax(scores, dim=-1)"),
    ]

    def culprit(t: datetime) -> list[str]:
        return [
            *py_traceback(frames),
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 3 has a total capacity of "
            "79.10 GiB of which 1.70 GiB is free. "
            "Including non-PyTorch memory, this process has 77.38 GiB memory in use. Of the allocated memory 70.94 "
            "GiB is allocated by PyTorch, and 5.56 GiB is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ]

    demo_job_with_victims(job, rng, 3, culprit, lambda r: 0.3 + 0.02 * r, victim_kind="nccl")
    b = job.batch()
    b.append(batch_start(job.at(-1.0), job))
    b += srun_exits(job, range(16), "Exited with exit code 1")
    return Built(
        meta(
            job,
            "rank 3 runs out of GPU memory on a long sequence; NCCL victims",
            truth(
                [],
                "user",
                False,
                "the longest sequence in rank 3's batch needs more memory than an 80 GB GPU has: the job's "
                "configuration, not the GPU.",
            ),
        ),
        job.files,
    )


# ----- verbatim lab captures --------------------------------------------------------------------------------------

LOGS = REPO / "tests" / "data" / "logs"


def lab(
    id: str,
    title: str,
    job_id: int,
    nodes: Sequence[str],
    tasks: int,
    copies: dict[str, str],
    truth_: dict[str, Any],
    notes: str,
) -> None:
    LAB[id] = (
        {
            "title": title,
            "source": "lab",
            "job_id": job_id,
            "job_nodes": list(nodes),
            "task_count": tasks,
            "layout": "block",
            "logs": ["job-%j-rank-%t.log", "job-%j-batch.log"]
            if any("batch" in d for d in copies.values())
            else ["job-%j-rank-%t.log"],
            "truth": truth_,
            "notes": notes,
        },
        copies,
    )


LAB: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}
lab(
    "lab-demo-crash",
    "demo trainer: rank 1 exits 13 on n2, rank 0 gets gloo's 'Connection closed by peer'",
    7,
    ["n1", "n2"],
    2,
    {"demo-crash-rank-0.log": "job-7-rank-0.log", "demo-crash-rank-1.log": "job-7-rank-1.log"},
    truth(["n2"], "unknown", True, "the injector's crash fault: rank 1 ended itself with exit status 13."),
    "tests/data/logs/demo-crash-rank-{0,1}.log, renamed.",
)
lab(
    "lab-demo-gpu-fault",
    "demo trainer: rank 1's CUDA launch failure (injected gpu-fault, XID 79 text)",
    7,
    ["n1"],
    2,
    {"demo-gpu-fault-rank-1.log": "job-7-rank-1.log"},
    truth(["n1"], "hardware", True, "the injector's gpu-fault (XID 79) on rank 1, which ran on n1 with rank 0."),
    "tests/data/logs/demo-gpu-fault-rank-1.log, renamed; rank 0's log of that run was not kept.",
)
lab(
    "lab-demo-segv",
    "demo trainer: rank 1 killed by SIGSEGV (faulthandler stack) on n2",
    7,
    ["n1", "n2"],
    2,
    {"demo-segv-rank-1.log": "job-7-rank-1.log"},
    truth(["n2"], "unknown", True, "the injector's segv fault: SIGSEGV sent to rank 1."),
    "tests/data/logs/demo-segv-rank-1.log, renamed; rank 0's log of that run was not kept.",
)
lab(
    "lab-demo-user-bug",
    "demo trainer: rank 1's ValueError from the training code's own check",
    7,
    ["n1", "n2"],
    2,
    {"demo-user-bug-rank-1.log": "job-7-rank-1.log"},
    truth([], "user", False, "the injector's user-bug fault: a malformed batch, caught by the trainer's check."),
    "tests/data/logs/demo-user-bug-rank-1.log, renamed; rank 0's log of that run was not kept.",
)
lab(
    "lab-requeue-no-failure",
    "the lab's demo job requeued by Rebound, then cancelled: nothing failed",
    1,
    ["n1", "n2"],
    4,
    {"lab-requeue-batch.log": "job-1-batch.log", "lab-requeue-rank-0.log": "job-1-rank-0.log"},
    truth(
        [],
        "unknown",
        True,
        "a requeue and a cancel from outside: srun's 'Terminated' lines are the stop, not a failure.",
    ),
    "tests/data/logs/lab-requeue-{batch,rank-0}.log from real Slurm 22.05, renamed; ranks 1-3 were not kept.",
)


# ----- the action each scenario's evidence allows ----------------------------------------------------------------

#: ``truth.action``: the strongest action the scenario's evidence allows (docs/failure-taxonomy.md, the action
#: ladder): ``drain`` only with node-level evidence about a culprit (a node agent's GPU event on its node, its
#: slurmd lost, a Slurm node failure); ``exclude`` when only the job's own output or its ranks' fates point at the
#: culprit's node (a rank's exit or signal, silence, a CUDA error the job printed); ``nothing`` without a culprit.
DRAIN = ("dead-node-and-neighbour-blip", "dead-node-not-responding", "ecc-dbe-event-and-cuda-error",
         "node-failure-named-only-by-srun", "two-nodes-lost", "xid-79-one-node")  # fmt: skip


def expected_action(meta_: dict[str, Any], id: str) -> str:
    if not meta_["truth"]["culprit_nodes"]:
        return "nothing"
    return "drain" if id in DRAIN else "exclude"


# ----- writing --------------------------------------------------------------------------------------------------


def write(directory: Path, meta_: dict[str, Any], files: dict[str, list[str]] | None) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "scenario.json").write_text(
        json.dumps({"id": directory.name, **meta_}, indent=2, ensure_ascii=False) + "\n"
    )
    for name, lines in (files or {}).items():
        (directory / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_suite(out: Path) -> list[str]:
    """Write every scenario under ``out``; return their ids."""
    for id, build in SCENARIOS.items():
        built = build()
        built.meta["truth"]["action"] = expected_action(built.meta, id)
        write(out / id, built.meta, built.files)
    for id, (meta_, copies) in LAB.items():
        meta_["truth"]["action"] = expected_action(meta_, id)
        write(out / id, meta_, None)
        for src, dst in copies.items():
            shutil.copyfile(LOGS / src, out / id / dst)
    return [*SCENARIOS, *LAB]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    written = write_suite(target)
    print(f"wrote {len(written)} scenarios ({len(SCENARIOS)} constructed, {len(LAB)} lab) under {target}")
