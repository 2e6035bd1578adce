"""Node-agent activities that collect evidence about a hung job before it is killed: its ranks and their stacks.

``node_rank_processes`` lists the job's rank processes on this node from ``/proc``; ``node_dump_stacks`` dumps
every rank's Python stack with py-spy. Neither fails the call for a node fact: a missing py-spy, a rank the agent
may not trace, a rank that exits mid-dump come back as error text on the result (per rank where it is per rank),
because the evidence from the other ranks is worth keeping and a retry would not change these facts.

Dumps run concurrently (bounded), each in its own py-spy process with its own timeout, so one rank stuck in the
kernel cannot hold up the others' evidence; the activity heartbeats meanwhile. A rank that is stopped or in
uninterruptible sleep cannot be paused for a consistent read, so py-spy reads it without pausing (as it does for
any rank whose pausing read failed or timed out while the rank is still alive).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from temporalio import activity

from activities.heartbeating import heartbeating
from activities.procs.proc import (
    JobProcess,
    boot_time,
    bounded_cmdline,
    is_alive,
    scan_job_processes,
    started_at,
)
from activities.procs.pyspy import (
    DumpRun,
    dump_argv,
    error_summary,
    find_py_spy,
    parse_dump,
    run_py_spy,
    truncate,
)
from activities.procs.ranks import choose_ranks, step_layout
from workflows.domain.procs import (
    NodeProcessesInput,
    NodeProcessesResult,
    RankProcess,
    RankStack,
    StackDumpInput,
    StackDumpResult,
    state_meaning,
)

__all__ = ["ProcsActivities"]

MAX_PARALLEL_DUMPS = 8
"""py-spy runs at once: a node has at most 8 GPUs, hence ranks, in the common case."""
_VERSION_TIMEOUT_S = 5.0
_MAX_ERROR_CHARS = 1000
# A pausing read of these states waits on the kernel (D) or fails (T, t: py-spy cannot suspend them again).
_UNPAUSABLE_STATES = frozenset({"D", "T", "t"})


class ProcsActivities:
    """The process-inspection activities of one node agent."""

    def __init__(
        self,
        node: str,
        *,
        cluster: str = "",
        py_spy: Path | None = None,
        proc_root: Path = Path("/proc"),
        clock_ticks_per_s: int | None = None,
        page_size: int | None = None,
    ) -> None:
        """Bind to ``node`` of ``cluster`` (processes of another node or cluster on the same host are never
        reported); ``py_spy`` overrides the search (beside this interpreter, then PATH).

        ``proc_root``, ``clock_ticks_per_s`` and ``page_size`` exist for tests that read a fake ``/proc``.
        """
        self._node = node
        self._cluster = cluster
        self._py_spy = py_spy
        self._proc_root = proc_root
        self._clk_tck = clock_ticks_per_s or os.sysconf("SC_CLK_TCK")
        self._page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self._versions: dict[Path, str] = {}

    @activity.defn(name="node_rank_processes")
    async def rank_processes(self, params: NodeProcessesInput) -> NodeProcessesResult:
        """List the job's rank processes on this node, one per rank, with their state.

        Args:
            params: The job.

        Returns:
            The ranks found (none when the job has no rank here); ``error`` is set when ``/proc`` is unreadable.
        """
        return await asyncio.to_thread(self._list, params.job_id)

    @activity.defn(name="node_dump_stacks")
    async def dump_stacks(self, params: StackDumpInput) -> StackDumpResult:
        """Dump every rank's Python stack on this node with py-spy.

        Args:
            params: The job, the limit for one py-spy run, the text bound per rank, and whether to add native frames.

        Returns:
            One ``RankStack`` per rank, sorted by rank; a rank without a stack says why in its ``error``. ``error``
            on the result is set when no rank could be dumped for a node-wide reason.
        """
        started = time.monotonic()
        listing = await asyncio.to_thread(self._list, params.job_id)
        if listing.error:
            return StackDumpResult(node=self._node, error=listing.error, elapsed_s=time.monotonic() - started)
        if not listing.processes:
            hint = f" ({listing.unreadable} processes unreadable: too few rights?)" if listing.unreadable else ""
            error = f"no process of job {params.job_id} on this node{hint}"
            return StackDumpResult(node=self._node, error=error, elapsed_s=time.monotonic() - started)
        binary = await asyncio.to_thread(find_py_spy, self._py_spy)
        if binary is None:
            error = "py-spy not found beside the agent's Python or on PATH (set node_agent.py_spy_path)"
            stacks = tuple(RankStack(rank=p.rank, pid=p.pid, node=self._node, error=error) for p in listing.processes)
            return StackDumpResult(node=self._node, stacks=stacks, error=error, elapsed_s=time.monotonic() - started)
        tool, tool_error = await self._tool(binary)
        if tool_error:
            stacks = tuple(
                RankStack(rank=p.rank, pid=p.pid, node=self._node, error=tool_error) for p in listing.processes
            )
            return StackDumpResult(
                node=self._node, stacks=stacks, error=tool_error, elapsed_s=time.monotonic() - started
            )

        limit = asyncio.Semaphore(MAX_PARALLEL_DUMPS)
        done = 0
        total = len(listing.processes)

        async def one(proc: RankProcess) -> RankStack:
            nonlocal done
            async with limit:
                stack = await self._dump_one(binary, proc, params)
            done += 1
            return stack

        # A slow rank must not look dead: ``(done, total)`` heartbeats while the dumps run.
        async with heartbeating(details=lambda: (done, total)):
            dumped = await asyncio.gather(*(one(p) for p in listing.processes))
        return StackDumpResult(node=self._node, stacks=tuple(dumped), tool=tool, elapsed_s=time.monotonic() - started)

    def _list(self, job_id: int) -> NodeProcessesResult:
        observed_at = datetime.now(UTC)
        try:
            scan = scan_job_processes(
                job_id, self._proc_root, exclude=frozenset({os.getpid()}), node=self._node, cluster=self._cluster
            )
        except OSError as e:
            return NodeProcessesResult(
                node=self._node, observed_at=observed_at, error=f"cannot list {self._proc_root}: {e}"
            )
        chosen, notes = choose_ranks(scan.processes)
        btime = boot_time(self._proc_root)
        layout, layout_note = step_layout(chosen)
        return NodeProcessesResult(
            node=self._node,
            observed_at=observed_at,
            processes=tuple(self._rank_process(job_id, p, btime) for p in chosen),
            unreadable=scan.unreadable,
            notes=tuple(scan.notes + notes + ([layout_note] if layout_note else [])),
            step_layout=layout,
        )

    def _rank_process(self, job_id: int, p: JobProcess, btime: float | None) -> RankProcess:
        s = p.stat
        return RankProcess(
            pid=p.pid,
            rank=p.rank,
            job_id=job_id,
            node=self._node,
            state=s.state,
            state_meaning=state_meaning(s.state),
            ppid=s.ppid,
            local_rank=p.local_rank,
            rank_source=p.rank_source,
            step_id=p.step_id,
            comm=s.comm,
            cpu_time_s=(s.utime_ticks + s.stime_ticks) / self._clk_tck,
            threads=s.threads,
            wchan=p.wchan,
            rss_bytes=s.rss_pages * self._page_size,
            started_at=started_at(s, btime, self._clk_tck),
            cmdline=bounded_cmdline(p.argv),
            task=p.task,
            local_world_size=p.local_world_size,
            world_size=p.world_size,
        )

    async def _tool(self, binary: Path) -> tuple[str, str]:
        """``("py-spy 0.4.3", "")``, or ``("", why it cannot run)``; a working version is remembered."""
        if binary in self._versions:
            return self._versions[binary], ""
        run = await run_py_spy([str(binary), "--version"], _VERSION_TIMEOUT_S)
        if run.missing or run.timed_out or run.returncode != 0:
            why = "timed out" if run.timed_out else error_summary(run.stderr or run.stdout)
            return "", f"py-spy at {binary} does not run: {why}"
        version = run.stdout.strip() or "py-spy"
        self._versions[binary] = version
        return version, ""

    async def _dump_one(self, binary: Path, proc: RankProcess, params: StackDumpInput) -> RankStack:
        started = time.monotonic()
        nonblocking = proc.state in _UNPAUSABLE_STATES
        run = await self._run(binary, proc.pid, params, nonblocking=nonblocking)
        failure = _failure(run, params.timeout_s)
        retry = failure and not nonblocking and not run.missing and not _denied(failure)
        if retry and is_alive(proc.pid, self._proc_root):
            # A pausing read that failed on a live rank (stopped meanwhile, stuck in the kernel): read it unpaused.
            nonblocking = True
            run = await self._run(binary, proc.pid, params, nonblocking=True)
            retry_failure = _failure(run, params.timeout_s)
            failure = f"{failure}; without pausing: {retry_failure}" if retry_failure else ""
        text = ""
        frames: tuple[str, ...] = ()
        if failure:
            if not is_alive(proc.pid, self._proc_root):
                failure = f"process {proc.pid} exited before its stack was read ({failure})"
            elif _denied(failure):
                failure = f"permission denied: the agent needs ptrace rights over pid {proc.pid} ({failure})"
        else:
            try:
                parsed = parse_dump(run.stdout, proc.pid)
                text, frames = parsed.text, parsed.main_frames
                failure = "" if frames else "py-spy found no main thread"
            except ValueError as e:
                text, failure = run.stdout.strip(), f"unreadable py-spy output: {e}"
        return RankStack(
            rank=proc.rank,
            pid=proc.pid,
            node=self._node,
            text=truncate(text, params.max_chars_per_rank),
            main_frames=frames,
            error=truncate(failure, _MAX_ERROR_CHARS),
            nonblocking=nonblocking,
            elapsed_s=time.monotonic() - started,
        )

    async def _run(self, binary: Path, pid: int, params: StackDumpInput, *, nonblocking: bool) -> DumpRun:
        argv = dump_argv(binary, pid, native=params.native, nonblocking=nonblocking)
        return await run_py_spy(argv, params.timeout_s)


def _denied(failure: str) -> bool:
    lowered = failure.lower()
    return "permission denied" in lowered or "operation not permitted" in lowered


def _failure(run: DumpRun, timeout_s: float) -> str:
    """Why a py-spy run gave no dump, or ``""`` when it did."""
    if run.timed_out:
        return f"py-spy timed out after {timeout_s:g} s"
    if run.missing:
        return run.stderr
    if run.returncode != 0 or not run.stdout.strip():
        return error_summary(run.stderr or run.stdout)
    return ""
