"""Trainer-side fault hooks: each step every rank looks in ``control/`` for a fault addressed to it and applies it.

The look is one ``stat`` of the directory per step; the directory is listed only when its mtime moved (or moved
recently, because two creations inside one timestamp tick leave the mtime unchanged).

Before acting, the rank writes ``control/ack-<id>-rank-<R>.json`` holding the wall-clock time it acted: that is
the fault's true onset (t0) the injector records. The effects:

- ``crash``: an ``[ERROR]`` line, then ``os._exit(13)`` (no cleanup, like a process killed by its own bug);
- ``hang``: block forever in Python, so the peers wait inside the next all_reduce;
- ``slow``: ``delay_s`` extra seconds per step from now on (0 ends it): a straggler;
- ``gpu-fault``: the training code raises ``RuntimeError`` with PyTorch's CUDA error text (see
  ``cuda_error_message``), printed as an uncaught exception, exit status 1;
- ``user-bug``: the next batch has the wrong shape and the training code's own check raises ``ValueError``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from deploy.demo.common import FaultAck, FaultRequest, RankEnv, RunPaths, atomic_write_json, log_line, utc_iso

CRASH_EXIT_CODE = 13
# Rescan while the directory changed this recently: a create in the same mtime tick as our last scan is
# otherwise invisible until the next change.
_RESCAN_WINDOW_NS = 2_000_000_000

# cudaError_t name and cudaGetErrorString() text, by the XID that typically comes with it.
_ILLEGAL_ADDRESS = ("cudaErrorIllegalAddress", "an illegal memory access was encountered")
_LAUNCH_FAILURE = ("cudaErrorLaunchFailure", "unspecified launch failure")
_ECC = ("cudaErrorECCUncorrectable", "uncorrectable ECC error encountered")
_CUDA_ERROR_BY_XID: dict[int, tuple[str, str]] = {
    13: _ILLEGAL_ADDRESS,
    31: _ILLEGAL_ADDRESS,
    43: _ILLEGAL_ADDRESS,
    48: _ECC,
    63: _ECC,
    64: _ECC,
    92: _ECC,
    94: _ECC,
    95: _ECC,
}


def cuda_error_message(xid: int | None) -> str:
    """The message of the ``RuntimeError`` PyTorch raises for an asynchronous CUDA error (c10_cuda_check).

    Printed as an uncaught exception it reads, e.g. for XID 79::

        RuntimeError: CUDA error: unspecified launch failure
        Search for `cudaErrorLaunchFailure' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.
        CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
        For debugging consider passing CUDA_LAUNCH_BLOCKING=1
        Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
    """  # noqa: E501
    name, text = _CUDA_ERROR_BY_XID.get(xid or 0, _LAUNCH_FAILURE)
    return (
        f"CUDA error: {text}\n"
        f"Search for `{name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
        " for more information.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below"
        " might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )


@dataclass
class FaultState:
    """What applied faults changed in the rank's behaviour, read by the training loop every step."""

    extra_delay_s: float = 0.0
    cuda_error: str | None = None
    corrupt_next_batch: bool = False


@dataclass
class FaultWatcher:
    """Finds the fault requests addressed to one rank of one attempt and applies them.

    Args:
        paths: the run's directories.
        env: the rank's identity: requests for other ranks or other attempts are ignored.
        emit: where log lines go (the trainer's stdout).
        exit_fn: how ``crash`` ends the process; replaced in unit tests.
        hang_fn: how ``hang`` blocks; replaced in unit tests.
    """

    paths: RunPaths
    env: RankEnv
    emit: Callable[[str], None] = lambda line: print(line, flush=True)
    exit_fn: Callable[[int], None] = os._exit
    hang_fn: Callable[[], None] = lambda: _hang_forever()
    state: FaultState = field(default_factory=FaultState)
    _last_mtime_ns: int | None = field(default=None, init=False)
    _done: set[str] = field(default_factory=set, init=False)
    _deferred: list[FaultRequest] = field(default_factory=list, init=False)

    def poll(self) -> list[FaultRequest]:
        """New requests addressed to this rank and attempt, oldest first; each is returned once."""
        try:
            mtime_ns = os.stat(self.paths.control).st_mtime_ns
        except FileNotFoundError:
            return []
        recent = time.time_ns() - mtime_ns < _RESCAN_WINDOW_NS
        if mtime_ns == self._last_mtime_ns and not recent:
            return []
        self._last_mtime_ns = mtime_ns
        found: list[tuple[str, FaultRequest]] = []
        with os.scandir(self.paths.control) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            if not (name.startswith("fault-") and name.endswith(".json")) or name in self._done:
                continue
            try:
                request = FaultRequest.model_validate_json((self.paths.control / name).read_bytes())
            except (OSError, ValidationError, ValueError):
                # The injector renames complete files into place, so this is a foreign or broken file: skip it
                # for good rather than re-reading it every step.
                self._done.add(name)
                continue
            self._done.add(name)
            if request.addressed_to(self.env) and not self.paths.ack_file(request.id, self.env.rank).exists():
                found.append((request.created_at, request))
        return [r for _, r in sorted(found, key=lambda item: item[0])]

    def acknowledge(self, request: FaultRequest, step: int) -> FaultAck:
        """Record, before acting, the exact time this rank applies ``request``."""
        now = time.time()
        ack = FaultAck(
            id=request.id,
            kind=request.kind,
            rank=self.env.rank,
            node=self.env.node,
            pid=os.getpid(),
            job_id=self.env.job_id,
            restart=self.env.restart,
            step=step,
            t0=utc_iso(now),
            t0_epoch=now,
        )
        atomic_write_json(self.paths.ack_file(request.id, self.env.rank), ack)
        return ack

    def apply(self, request: FaultRequest, step: int) -> None:
        """Acknowledge ``request`` and act on it; ``crash`` and ``hang`` do not return."""
        self.acknowledge(request, step)
        if request.kind == "crash":
            self._log("ERROR", f"step={step} fatal error (fault {request.id}): exiting with code {CRASH_EXIT_CODE}")
            sys.stdout.flush()
            sys.stderr.flush()
            self.exit_fn(CRASH_EXIT_CODE)
        elif request.kind == "hang":
            # A real hang announces nothing; the ack file is the only trace.
            self.hang_fn()
        elif request.kind == "slow":
            self.state.extra_delay_s = max(0.0, request.delay_s or 0.0)
        elif request.kind == "gpu-fault":
            self.state.cuda_error = cuda_error_message(request.xid)
        elif request.kind == "user-bug":
            self.state.corrupt_next_batch = True

    def check(self, step: int) -> FaultState:
        """Poll and apply everything due; called at the start of every step.

        A request with ``at_step`` waits for that step, so ranks that saw it one step apart still fail together.
        """
        self._deferred += self.poll()
        due = [r for r in self._deferred if r.at_step is None or r.at_step <= step]
        self._deferred = [r for r in self._deferred if r not in due]
        for request in due:
            self.apply(request, step)
        return self.state

    def _log(self, level: str, message: str) -> None:
        self.emit(log_line(level, self.env.rank, self.env.world_size, self.env.node, message))


def _hang_forever() -> None:
    # Sleep in a loop rather than wait on a lock: the default SIGTERM/SIGKILL still end the process, and a stack
    # dump (faulthandler, py-spy) shows a plain Python frame, like a rank stuck in user code.
    while True:
        time.sleep(3600)
