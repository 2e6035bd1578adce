"""Breaking a running demo job for real, and recording the true fault onset (t0) of every injection.

Trainer-side faults (``crash``, ``hang``, ``slow``, ``gpu-fault``, ``user-bug``) are requests written to the run's
``control/``; the target rank applies one at its next step and first writes an ack with the wall-clock time it
acted, which becomes t0 (bounded wait, default 15 s). ``segv``, ``kill`` (SIGKILL of the rank's own process: a
worker under torchrun, never its agent) and ``node-crash`` (``deploy.demo.node_crash``) use signals, and t0 is the
signal time. ``gpu-fault`` first appends the XID to the node's fake-NVML state and uses that time as t0: the XID
is the hardware onset and NVML can see it before the rank dies, so the ack time would make detection look earlier
than the fault. ``xid`` appends the XID only: the rank keeps training and
prints nothing, so only the GPU signal can tell.

Every injection appends one JSON line (``InjectionRecord``) to ``layout.injections``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

from pydantic import ValidationError

from deploy.demo.common import (
    FaultAck,
    FaultKind,
    FaultRequest,
    RankInfo,
    RunPaths,
    TrainerFaultKind,
    atomic_write_json,
    utc_iso,
)
from deploy.demo.injections import (
    AckTimeoutError,
    InjectionError,
    InjectionRecord,
    NodeNotRunningError,
    RankNotRunningError,
    UnknownRunError,
    append_record,
    live_rank,
    live_ranks,
    new_id,
    rank_is_live,
    read_injections,
    run_paths,
    utc_datetime,
)
from deploy.demo.node_crash import inject_node_crash
from deploy.local.fake_nvml_state import append_xid, mark_gpu_lost
from deploy.local.layout import LabLayout

__all__ = [
    "AckTimeoutError",
    "InjectionError",
    "InjectionRecord",
    "NodeNotRunningError",
    "RankNotRunningError",
    "UnknownRunError",
    "inject",
    "inject_crash",
    "inject_gpu_fault",
    "inject_hang",
    "inject_kill",
    "inject_silent_xid",
    "inject_node_crash",
    "inject_segv",
    "inject_slow",
    "inject_user_bug",
    "parse_rank",
    "read_injections",
]

DEFAULT_ACK_TIMEOUT_S = 15.0
DEFAULT_XID = 79
_ACK_POLL_S = 0.02


def _wait_for_acks(paths: RunPaths, fault_id: str, ranks: Iterable[RankInfo], timeout_s: float) -> list[FaultAck]:
    """Poll for the targets' ack files; returns as soon as one exists. Gives up early if every target died."""
    targets = list(ranks)
    deadline = time.monotonic() + timeout_s
    while True:
        acks = []
        for info in targets:
            path = paths.ack_file(fault_id, info.rank)
            if path.exists():
                try:
                    acks.append(FaultAck.model_validate_json(path.read_bytes()))
                except (OSError, ValidationError):
                    continue  # written atomically, so only a foreign file can fail; keep waiting
        if acks or time.monotonic() >= deadline or not any(rank_is_live(i) for i in targets):
            return sorted(acks, key=lambda a: a.t0_epoch)
        time.sleep(_ACK_POLL_S)


def _request_fault(
    layout: LabLayout,
    run: str,
    kind: TrainerFaultKind,
    targets: list[RankInfo],
    *,
    rank: int | None,
    timeout_s: float,
    delay_s: float | None = None,
    gpu: int | None = None,
    xid: int | None = None,
    t0_override: float | None = None,
    at_step: int | None = None,
) -> InjectionRecord:
    """Write a fault request for ``targets``, wait for the first ack, record the injection."""
    paths = run_paths(layout, run)
    injected_at = time.time()
    fault_id = new_id(kind)
    first = targets[0]
    request = FaultRequest(
        id=fault_id,
        kind=kind,
        rank=rank,
        job_id=first.job_id,
        restart=first.restart,
        delay_s=delay_s,
        gpu=gpu,
        xid=xid,
        at_step=at_step,
        created_at=utc_iso(injected_at),
    )
    fault_path = paths.fault_file(fault_id)
    atomic_write_json(fault_path, request)
    acks = _wait_for_acks(paths, fault_id, targets, timeout_s)
    if not acks:
        # Withdraw the request so it cannot fire later, unmeasured; then look once more in case it just did.
        fault_path.unlink(missing_ok=True)
        acks = _wait_for_acks(paths, fault_id, targets, 0.0)
    if not acks:
        who = f"rank {rank}" if rank is not None else "any rank"
        if not any(rank_is_live(i) for i in targets):
            raise RankNotRunningError(f"{kind} fault for run {run!r}: {who} exited before applying it")
        raise AckTimeoutError(
            f"{kind} fault for run {run!r} {who} was not applied within {timeout_s:.1f}s "
            f"(request withdrawn): is the rank stuck outside its step loop, hung already, or not started yet?"
        )
    ack = acks[0]
    t0 = t0_override if t0_override is not None else ack.t0_epoch
    record = InjectionRecord(
        id=fault_id,
        kind=kind,
        run=run,
        job_id=first.job_id,
        restart=first.restart,
        rank=rank,
        node=ack.node if rank is not None else None,
        gpu=gpu,
        xid=xid,
        delay_s=delay_s,
        pids=[a.pid for a in acks],
        t0=utc_datetime(t0),
        t0_epoch=t0,
        acked_at=utc_datetime(ack.t0_epoch),
        injected_at=utc_datetime(injected_at),
    )
    append_record(layout, record)
    return record


def inject_crash(
    layout: LabLayout, run: str, rank: int, *, timeout_s: float = DEFAULT_ACK_TIMEOUT_S
) -> InjectionRecord:
    """Make ``rank`` log an error and exit with code 13 at its next step."""
    info = live_rank(layout, run, rank)
    return _request_fault(layout, run, "crash", [info], rank=rank, timeout_s=timeout_s)


def inject_hang(layout: LabLayout, run: str, rank: int, *, timeout_s: float = DEFAULT_ACK_TIMEOUT_S) -> InjectionRecord:
    """Make ``rank`` block forever at its next step; its peers then hang in the next all_reduce."""
    info = live_rank(layout, run, rank)
    return _request_fault(layout, run, "hang", [info], rank=rank, timeout_s=timeout_s)


def inject_slow(
    layout: LabLayout, run: str, rank: int, delay_s: float, *, timeout_s: float = DEFAULT_ACK_TIMEOUT_S
) -> InjectionRecord:
    """Make ``rank`` a straggler: ``delay_s`` more seconds every step from now on (0 restores it)."""
    if delay_s < 0:
        raise ValueError("delay_s must be >= 0")
    info = live_rank(layout, run, rank)
    return _request_fault(layout, run, "slow", [info], rank=rank, timeout_s=timeout_s, delay_s=delay_s)


def inject_user_bug(
    layout: LabLayout, run: str, rank: int | None = None, *, timeout_s: float = DEFAULT_ACK_TIMEOUT_S
) -> InjectionRecord:
    """Make the training code raise ``ValueError`` (shape mismatch) on ``rank``, or on every rank if ``None``."""
    targets = [live_rank(layout, run, rank)] if rank is not None else live_ranks(layout, run)
    at_step = None
    if rank is None:
        # Ranks run in lockstep (one all_reduce per step) but may see the request one step apart: name a step
        # a little ahead so every rank fails on the same batch, as a real bug in the data pipeline does.
        at_step = _max_progress(layout, run) + _USER_BUG_LEAD_STEPS
    return _request_fault(layout, run, "user-bug", targets, rank=rank, timeout_s=timeout_s, at_step=at_step)


_USER_BUG_LEAD_STEPS = 3


def _max_progress(layout: LabLayout, run: str) -> int:
    steps = [0]
    for path in run_paths(layout, run).ranks.glob("rank-*.progress"):
        try:
            steps.append(int(path.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return max(steps)


def inject_gpu_fault(
    layout: LabLayout,
    run: str,
    rank: int,
    *,
    gpu: int | None = None,
    xid: int = DEFAULT_XID,
    mark_lost: bool = False,
    timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
) -> InjectionRecord:
    """Raise an XID on the GPU ``rank`` uses (fake NVML of its node), then make the rank die with PyTorch's
    CUDA error text.

    Args:
        gpu: NVML index to fault; default the rank's own GPU (from SLURM_STEP_GPUS/CUDA_VISIBLE_DEVICES/local id).
        xid: the XID code appended to the node's state file.
        mark_lost: also make the GPU fall off the bus (every later NVML call on it fails with GPU_IS_LOST).
    """
    info = live_rank(layout, run, rank)
    target_gpu = info.gpu if gpu is None else gpu
    state = layout.nvml_state(info.node)
    if not state.exists():
        raise InjectionError(f"node {info.node} has no fake NVML state at {state}: is the lab (agents) up?")
    t0 = time.time()
    append_xid(state, target_gpu, xid)
    if mark_lost:
        mark_gpu_lost(state, target_gpu)
    try:
        return _request_fault(
            layout, run, "gpu-fault", [info], rank=rank, timeout_s=timeout_s, gpu=target_gpu, xid=xid, t0_override=t0
        )
    except AckTimeoutError as exc:
        # The XID did happen: say so, or the node's NVML state would show an event nobody recorded.
        raise AckTimeoutError(f"{exc}; note: XID {xid} on GPU {target_gpu} was already appended to {state}") from None


def inject_silent_xid(
    layout: LabLayout, run: str, rank: int, *, gpu: int | None = None, xid: int = DEFAULT_XID
) -> InjectionRecord:
    """Raise an XID on the GPU ``rank`` uses and nothing else: the rank keeps training and prints no error.

    A real GPU can fault without the process noticing at once (the error surfaces at the next synchronising
    call, or never for some XIDs); only the GPU signal (the node agent's NVML events) can tell.
    """
    info = live_rank(layout, run, rank)
    target_gpu = info.gpu if gpu is None else gpu
    state = layout.nvml_state(info.node)
    if not state.exists():
        raise InjectionError(f"node {info.node} has no fake NVML state at {state}: is the lab (agents) up?")
    t0 = time.time()
    append_xid(state, target_gpu, xid)
    record = InjectionRecord(
        id=new_id("xid"),
        kind="xid",
        run=run,
        job_id=info.job_id,
        restart=info.restart,
        rank=rank,
        node=info.node,
        gpu=target_gpu,
        xid=xid,
        t0=utc_datetime(t0),
        t0_epoch=t0,
        injected_at=utc_datetime(t0),
    )
    append_record(layout, record)
    return record


def inject_segv(layout: LabLayout, run: str, rank: int) -> InjectionRecord:
    """Send SIGSEGV to ``rank``'s process; it dies printing a faulthandler stack (status: signal 11)."""
    return _signal_rank(layout, run, rank, "segv", signal.SIGSEGV)


def inject_kill(layout: LabLayout, run: str, rank: int) -> InjectionRecord:
    """SIGKILL ``rank``'s own process (the OOM killer's or an operator's ``kill -9``): it dies without a word.

    The pid is the one the rank wrote in its rank file, so under torchrun it is the worker, never the torchrun
    agent (the agent then reports the worker's signal and exits, which ends the job step).
    """
    return _signal_rank(layout, run, rank, "kill", signal.SIGKILL)


def _signal_rank(layout: LabLayout, run: str, rank: int, kind: FaultKind, sig: signal.Signals) -> InjectionRecord:
    info = live_rank(layout, run, rank)
    t0 = time.time()
    os.kill(info.pid, sig)
    record = InjectionRecord(
        id=new_id(kind),
        kind=kind,
        run=run,
        job_id=info.job_id,
        restart=info.restart,
        rank=rank,
        node=info.node,
        gpu=None,
        xid=None,
        pids=[info.pid],
        t0=utc_datetime(t0),
        t0_epoch=t0,
        injected_at=utc_datetime(t0),
    )
    append_record(layout, record)
    return record


def parse_rank(rank: int | str | None) -> int | None:
    """``3``/``"3"`` -> 3; ``None``/``"all"`` -> None (every rank)."""
    if rank is None or isinstance(rank, int):
        return rank
    text = rank.strip().lower()
    if text == "all":
        return None
    if not text.isdigit():
        raise ValueError(f"rank must be a number or 'all', not {rank!r}")
    return int(text)


def inject(
    layout: LabLayout,
    kind: FaultKind,
    *,
    run: str | None = None,
    rank: int | str | None = None,
    node: str | None = None,
    delay_s: float | None = None,
    gpu: int | None = None,
    xid: int = DEFAULT_XID,
    frozen_tasks: bool = False,
    timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
) -> InjectionRecord:
    """One entry point for ``rebound lab inject KIND``: checks the arguments ``kind`` needs and dispatches.

    ``rank`` may come straight from the command line: an int, a digit string, or ``"all"`` (user-bug only).
    Arguments a kind does not use are ignored (``delay_s`` outside ``slow``, ``rank`` for ``node-crash``).

    Raises:
        ValueError: an argument ``kind`` needs is missing.
        InjectionError: the injection itself failed (unknown run, rank or node not running, no ack).
    """
    if kind == "node-crash":
        if node is None:
            raise ValueError("node-crash needs a node")
        return inject_node_crash(layout, node, run=run, frozen_tasks=frozen_tasks)
    if run is None:
        raise ValueError(f"{kind} needs a run")
    target = parse_rank(rank)
    if kind == "user-bug":
        return inject_user_bug(layout, run, target, timeout_s=timeout_s)
    if target is None:
        raise ValueError(f"{kind} needs one rank, not {rank!r}")
    rank = target
    if kind == "crash":
        return inject_crash(layout, run, rank, timeout_s=timeout_s)
    if kind == "segv":
        return inject_segv(layout, run, rank)
    if kind == "kill":
        return inject_kill(layout, run, rank)
    if kind == "hang":
        return inject_hang(layout, run, rank, timeout_s=timeout_s)
    if kind == "slow":
        if delay_s is None:
            raise ValueError("slow needs delay_s")
        return inject_slow(layout, run, rank, delay_s, timeout_s=timeout_s)
    if kind == "xid":
        return inject_silent_xid(layout, run, rank, gpu=gpu, xid=xid)
    return inject_gpu_fault(layout, run, rank, gpu=gpu, xid=xid, timeout_s=timeout_s)
