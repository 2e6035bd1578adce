"""Parse large scheduler documents in a child process, so the worker's event loop keeps running meanwhile.

At 10,000 jobs ``squeue --json`` is about 40 MB and turning it into models takes 1 to 2 s of pure Python. Done on
the worker's event loop (as it was), every heartbeat, every other job's poll and every short activity waited that
long, once a second. A thread does not help (the parse holds the GIL), so documents of at least
``min_bytes`` go to a small process pool (spawned, never forked: the worker runs threads), which reads them from a
file, parses them with the same functions (``activities.slurm.parse``) and sends the models back pickled in chunks
of ``chunk`` records. The loop then only unpickles one chunk at a time and yields between chunks
(``docs/benchmarks/scale-costs.md`` has the figures).

Small documents (a lab, a small cluster) are parsed in-process: a round trip to the child costs more than they do.
A child that dies (killed, out of memory) costs one parse in-process and a new pool the next time, never a read.
Errors are the parser's own (``ReboundError``), raised in the caller as if the parse had run there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import IO, TypeVar

from activities.slurm.parse import load_payload, parse_jobs, parse_nodes, parse_submission
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import SlurmJob, SlurmNode
from workflows.domain.submission import SubmittedJob

__all__ = ["DEFAULT_CHUNK", "DEFAULT_MIN_BYTES", "ParseOffload"]

log = logging.getLogger(__name__)

#: Below this size a document is parsed in-process (about 250 jobs or 750 nodes of 22.05 output).
DEFAULT_MIN_BYTES = 1_000_000
#: Records per pickled chunk: unpickling one takes a few milliseconds on the loop.
DEFAULT_CHUNK = 250
#: Child deaths in a row after which documents are parsed in-process (a child that cannot start, e.g. a main
#: module without an ``if __name__ == "__main__"`` guard under spawn, would otherwise cost a start per poll).
_MAX_BROKEN = 3
#: prctl(2) option: the signal a child gets when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1

_T = TypeVar("_T", SlurmJob, SlurmNode, SubmittedJob)
#: What the child sends back: pickled chunks, or the parser's classified error as (kind, message).
_Outcome = tuple[list[bytes], None] | tuple[None, tuple[str, str]]


def _jobs_in_child(path: str, source: str, chunk: int) -> _Outcome:
    return _chunked(lambda: parse_jobs(load_payload(_read(path), source=source), source=source), chunk)


def _nodes_in_child(path: str, source: str, chunk: int) -> _Outcome:
    return _chunked(lambda: parse_nodes(load_payload(_read(path), source=source), source=source), chunk)


def _submission_in_child(path: str, source: str, job_id: int) -> _Outcome:
    def find() -> Sequence[object]:
        found = _submission_of(load_payload(_read(path), source=source), job_id, source)
        return () if found is None else (found,)

    return _chunked(find, 1)


def _submission_of(payload: Mapping[str, object], job_id: int, source: str) -> SubmittedJob | None:
    jobs = payload.get("jobs")
    record = (
        next((j for j in jobs if isinstance(j, dict) and j.get("job_id") == job_id), None)
        if isinstance(jobs, list)
        else None
    )
    return None if record is None else parse_submission(record, source=source)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _chunked(parse: Callable[[], Sequence[object]], chunk: int) -> _Outcome:
    try:
        items = parse()
    except ReboundError as e:  # sent back as data: its subclasses' constructors differ
        return None, (e.kind.value, e.message)
    pieces = [pickle.dumps(tuple(items[i : i + chunk]), protocol=5) for i in range(0, len(items), chunk)]
    return pieces, None


class ParseOffload:
    """``squeue``/``sinfo`` JSON (or slurmrestd's) into models, off the event loop when the document is large.

    The document travels as a file, never through the worker's memory twice: the CLI adapter points the command's
    stdout at ``output_file()``, and the child reads that file itself (copying 40 MB into a pipe, or pickling it,
    holds the GIL for a fifth of a second). The files live in a private directory (mode 0700) and are deleted
    after each parse.

    Args:
        min_bytes: Documents at least this long go to a child process; shorter ones are parsed in-process.
        processes: Size of the pool (2: a snapshot's two documents are parsed side by side).
        chunk: Records per chunk sent back.
        enabled: False parses everything in-process (as before).
    """

    def __init__(
        self,
        *,
        min_bytes: int = DEFAULT_MIN_BYTES,
        processes: int = 2,
        chunk: int = DEFAULT_CHUNK,
        enabled: bool = True,
    ) -> None:
        if min_bytes < 0 or processes < 1 or chunk < 1:
            raise ValueError(f"bad ParseOffload sizes: min_bytes={min_bytes} processes={processes} chunk={chunk}")
        self.min_bytes = min_bytes
        self.processes = processes
        self.chunk = chunk
        self.enabled = enabled
        self.offloaded = 0
        """How many documents went to a child (for tests and benchmarks)."""
        self._pool: ProcessPoolExecutor | None = None
        self._broken_in_a_row = 0
        self._lock = threading.Lock()
        self._scratch: str | None = None

    @contextlib.contextmanager
    def output_file(self) -> Iterator[IO[bytes]]:
        """A new, empty private file for one command's output; deleted when the block ends."""
        with self._lock:
            if self._scratch is None:
                self._scratch = tempfile.mkdtemp(prefix="rebound-scheduler-")  # 0700
        with tempfile.NamedTemporaryFile(dir=self._scratch, prefix="out-", suffix=".json") as f:
            yield f

    async def jobs_file(self, path: str, *, source: str) -> tuple[SlurmJob, ...]:
        """See ``parse.parse_jobs`` (of ``load_payload`` of the file's bytes).

        Raises:
            ReboundError: As the parser raises it.
        """
        if self._offloads(os.stat(path).st_size):
            outcome = await self._run(_jobs_in_child, path, source, self.chunk)
            if outcome is not None:
                return await self._unpack(outcome, SlurmJob)
        return parse_jobs(load_payload(await asyncio.to_thread(_read, path), source=source), source=source)

    async def nodes_file(self, path: str, *, source: str) -> tuple[SlurmNode, ...]:
        """See ``parse.parse_nodes`` (of ``load_payload`` of the file's bytes).

        Raises:
            ReboundError: As the parser raises it.
        """
        if self._offloads(os.stat(path).st_size):
            outcome = await self._run(_nodes_in_child, path, source, self.chunk)
            if outcome is not None:
                return await self._unpack(outcome, SlurmNode)
        return parse_nodes(load_payload(await asyncio.to_thread(_read, path), source=source), source=source)

    async def submission_file(self, path: str, job_id: int, *, source: str) -> SubmittedJob | None:
        """The submission options of job ``job_id`` in a ``squeue --json`` file (``parse.parse_submission``); None
        when the file does not list it.

        Raises:
            ReboundError: As the parser raises it.
        """
        if self._offloads(os.stat(path).st_size):
            outcome = await self._run(_submission_in_child, path, source, job_id)
            if outcome is not None:
                found = await self._unpack(outcome, SubmittedJob)
                return found[0] if found else None
        return _submission_of(load_payload(await asyncio.to_thread(_read, path), source=source), job_id, source)

    async def jobs(self, raw: bytes, *, source: str) -> tuple[SlurmJob, ...]:
        """``jobs_file`` for a document already in memory (slurmrestd's answer).

        Raises:
            ReboundError: As the parser raises it.
        """
        if not self._offloads(len(raw)):
            return parse_jobs(load_payload(raw, source=source), source=source)
        with self.output_file() as f:
            await asyncio.to_thread(_write, f, raw)  # file writes release the GIL; pickling does not
            return await self.jobs_file(f.name, source=source)

    async def nodes(self, raw: bytes, *, source: str) -> tuple[SlurmNode, ...]:
        """``nodes_file`` for a document already in memory (slurmrestd's answer).

        Raises:
            ReboundError: As the parser raises it.
        """
        if not self._offloads(len(raw)):
            return parse_nodes(load_payload(raw, source=source), source=source)
        with self.output_file() as f:
            await asyncio.to_thread(_write, f, raw)
            return await self.nodes_file(f.name, source=source)

    def close(self) -> None:
        """Stop the child processes (a later parse starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _offloads(self, size: int) -> bool:
        return self.enabled and size >= self.min_bytes

    async def _run(
        self, work: Callable[[str, str, int], _Outcome], path: str, source: str, arg: int
    ) -> _Outcome | None:
        """The child's outcome; None when the pool broke (the caller parses in-process this once)."""
        pool = self._ensure_pool()
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(pool, work, path, source, arg)
        except BrokenProcessPool as e:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
                    self._broken_in_a_row += 1
                if self._broken_in_a_row >= _MAX_BROKEN:
                    self.enabled = False
            pool.shutdown(wait=False, cancel_futures=True)
            log.warning(
                "scheduler parse process died (%s): parsing %s in-process%s",
                e,
                source,
                "" if self.enabled else f"; offloading stopped after {_MAX_BROKEN} deaths in a row",
            )
            return None
        self._broken_in_a_row = 0
        self.offloaded += 1
        return outcome

    async def _unpack(self, outcome: _Outcome, model: type[_T]) -> tuple[_T, ...]:
        pieces, error = outcome
        if error is not None:
            kind, message = error
            raise ReboundError(FailureKind(kind), message)
        items: list[_T] = []
        for piece in pieces or ():
            part = pickle.loads(piece)  # our own child's bytes, pickled by the code above
            if not isinstance(part, tuple) or not all(isinstance(x, model) for x in part):
                raise ReboundError(FailureKind.SCHEDULER_BAD_RESPONSE, f"parse process sent back {type(part)}")
            items.extend(part)
            await asyncio.sleep(0)  # let heartbeats and other polls run between chunks
        return tuple(items)

    def _ensure_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn, never fork: the worker runs threads (Temporal's core, the executor's own).
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_follow_parent,
                    initargs=(os.getpid(),),
                )
            return self._pool


def _follow_parent(parent: int) -> None:
    """In a parse child: die with the worker. A SIGKILLed worker cannot shut its pool down, and its spawned children
    would otherwise live on (seen on the lab: orphans of a killed benchmark worker, still there half an hour later)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the worker died before the line above took effect
        os._exit(0)


def _write(f: IO[bytes], raw: bytes) -> None:
    f.write(raw)
    f.flush()
