"""The scheduler port over Slurm's commands: ``squeue``/``sinfo --json`` to read, ``scontrol`` to act.

Every command runs as an argument list through ``asyncio.create_subprocess_exec`` (never a shell), with a
deadline; on cancellation or timeout the child is killed. Observed on Slurm 22.05.8 (tests/data/slurm):

* ``squeue --json`` and ``sinfo --json`` ignore ``-j``/``-n``: one call lists everything, filtering is ours.
* With slurmctld down they still exit 0, with an ``errors`` entry and an empty list (see ``parse``).
  ``scontrol update`` then says ``Unable to contact slurm controller``, ``scontrol requeue`` says
  ``Unexpected message received``; both take about 1 s.
* With ``SLURM_CONF`` pointing at a missing file every command retries for 60 s before failing, so the file
  is checked here first (``CONFIGURATION`` at once instead of a ``SCHEDULER_TIMEOUT``).
* ``scontrol`` prints Slurm's ``slurm_strerror()`` text, mostly followed by ``for job N``; the error number is
  recovered from that text (``errors.errno_from_text``).

Measured on the 4-node lab: ``squeue --json`` about 8 ms, ``sinfo --json`` 7 ms, ``scontrol ping`` 3 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from activities.slurm.errors import errno_from_text, kind_from_text
from activities.slurm.guarded import GuardedActions, SlurmCallError
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.port import JobSubmission, gather_snapshot
from activities.slurm.submission import parse_saved_environment
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.slurm import ClusterSnapshot, SlurmJob, SlurmNode

__all__ = ["CommandResult", "SlurmCliScheduler"]

_SQUEUE = ("squeue", "--json", "-a")  # -a: hidden partitions too; --json lists every state anyway
_SINFO = ("sinfo", "--json")
_STDERR_LIMIT = 500
_SAVE_DIR = "StateSaveLocation"


@dataclass(frozen=True)
class CommandResult:
    """What one finished command produced."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: str


class SlurmCliScheduler(GuardedActions):
    """``SchedulerPort`` over the Slurm client commands.

    Args:
        env: Environment of the commands (``SLURM_CONF``, ``PATH``...); None inherits the worker's.
        bin_dir: Directory holding ``squeue``/``sinfo``/``scontrol``; None searches ``PATH`` of ``env``.
        timeout_s: Deadline of one command.
        parser: Turns ``squeue``/``sinfo`` output into models, large documents off the event loop (default:
            ``ParseOffload()``'s sizes).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        bin_dir: Path | None = None,
        timeout_s: float = 15.0,
        *,
        parser: ParseOffload | None = None,
    ) -> None:
        self._env = dict(env) if env is not None else None
        self._bin_dir = bin_dir
        self._timeout_s = timeout_s
        self._parser = parser if parser is not None else ParseOffload()

    async def snapshot(self) -> ClusterSnapshot:
        """See ``SchedulerReads.snapshot``: one ``squeue`` and one ``sinfo``, run concurrently.

        Raises:
            ReboundError: The first failure of the two commands.
        """
        return await gather_snapshot(self)

    async def list_jobs(self) -> tuple[SlurmJob, ...]:
        """See ``SchedulerReads.list_jobs``.

        Raises:
            ReboundError: Transport, configuration or parse failures.
        """
        with self._parser.output_file() as out:
            await self._read_output(*_SQUEUE, stdout=out)
            return await self._parser.jobs_file(out.name, source="squeue --json")

    async def get_job(self, job_id: int) -> SlurmJob | None:
        """See ``SchedulerReads.get_job`` (one ``squeue --json``, filtered here).

        Raises:
            ReboundError: As for ``list_jobs``.
        """
        return next((job for job in await self.list_jobs() if job.job_id == job_id), None)

    async def list_nodes(self) -> tuple[SlurmNode, ...]:
        """See ``SchedulerReads.list_nodes``.

        Raises:
            ReboundError: Transport, configuration or parse failures.
        """
        with self._parser.output_file() as out:
            await self._read_output(*_SINFO, stdout=out)
            return await self._parser.nodes_file(out.name, source="sinfo --json")

    async def get_node(self, name: str) -> SlurmNode | None:
        """See ``SchedulerReads.get_node`` (one ``sinfo --json``, filtered here).

        Raises:
            ReboundError: As for ``list_nodes``.
        """
        return next((node for node in await self.list_nodes() if node.name == name), None)

    async def ping(self) -> None:
        """See ``SchedulerReads.ping`` (``scontrol ping``).

        Raises:
            ReboundError: ``SCHEDULER_UNREACHABLE`` when slurmctld is down; configuration or timeout kinds.
        """
        result = await self.run("scontrol", "ping")
        if result.returncode != 0:
            output = (result.stdout.decode("utf-8", "replace") + result.stderr).strip()
            output = output.splitlines()[0] if output else f"exited {result.returncode}"
            kind = kind_from_text(output)
            if kind is FailureKind.SCHEDULER_REJECTED:
                kind = FailureKind.SCHEDULER_UNREACHABLE  # "is DOWN" in every form Slurm prints it
            raise ReboundError(kind, f"scontrol ping: {_trim(output)}")

    async def read_submission(self, job_id: int) -> JobSubmission:
        """See ``SchedulerActions.read_submission``: ``squeue --json`` and ``scontrol write batch_script J -``.

        Raises:
            ReboundError: ``JOB_NOT_FOUND``; ``SCHEDULER_REJECTED`` when Slurm has no script for it; transport,
                configuration or parse failures.
        """
        with self._parser.output_file() as out:
            await self._read_output(*_SQUEUE, stdout=out)
            submitted = await self._parser.submission_file(out.name, job_id, source="squeue --json")
        if submitted is None:
            raise ReboundError(FailureKind.JOB_NOT_FOUND, f"job {job_id} is not known to the scheduler")
        result = await self.run("scontrol", "write", "batch_script", str(job_id), "-")
        if result.returncode != 0 or not result.stdout:
            text = result.stderr.strip() or f"exited {result.returncode} with no script"
            kind = kind_from_text(text) if result.returncode != 0 else FailureKind.SCHEDULER_REJECTED
            raise ReboundError(kind, f"scontrol write batch_script {job_id}: {_trim(text)}")
        environment, note = await self._saved_environment(job_id)
        return JobSubmission(
            **submitted.model_dump(), script=result.stdout, environment=environment, environment_note=note
        )

    async def _saved_environment(self, job_id: int) -> tuple[dict[str, str] | None, str]:
        """The environment slurmctld saved with the job, readable where this worker runs on the controller's host
        as root or SlurmUser (``StateSaveLocation``); otherwise None and why. Never raises: it is optional."""
        config = await self.run("scontrol", "show", "config")
        lines = config.stdout.decode("utf-8", "replace").splitlines()
        found = next((ln.split("=", 1)[1].strip() for ln in lines if ln.split("=", 1)[0].strip() == _SAVE_DIR), "")
        if config.returncode != 0 or not found:
            return None, f"not captured: scontrol show config gave no {_SAVE_DIR}"
        path = Path(found) / f"hash.{job_id % 10}" / f"job.{job_id}" / "environment"
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            return None, f"not captured: slurmctld's saved environment is not readable here ({e.strerror}: {path})"
        env = parse_saved_environment(raw)
        if env is None:
            return None, f"not captured: {path} is not in the layout Slurm 22.05 writes"
        return env, f"captured from slurmctld's saved job environment ({len(env)} variables)"

    async def _submit(self, args: Sequence[str], script: bytes, env: Mapping[str, str]) -> int:
        conf = (self._env if self._env is not None else os.environ).get("SLURM_CONF")
        # sbatch must reach the cluster this adapter reads, whatever the job's own environment says.
        result = await self.run("sbatch", *args, stdin=script, env={**env, **({"SLURM_CONF": conf} if conf else {})})
        out = result.stdout.decode("utf-8", "replace").strip()
        first = out.split(";", 1)[0]  # --parsable: "id" or "id;cluster"
        if result.returncode != 0 or not first.isdigit():
            text = result.stderr.strip() or out or f"exited {result.returncode}"
            raise SlurmCallError(kind_from_text(text), f"sbatch: {_trim(text)}", errno_from_text(text))
        return int(first)

    async def _drain(self, node: str, reason: str) -> None:
        await self._scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")

    async def _resume(self, node: str) -> None:
        await self._scontrol("update", f"nodename={node}", "state=resume")

    async def _requeue(self, job_id: int, hold: bool) -> None:
        await self._scontrol("requeuehold" if hold else "requeue", str(job_id))

    async def _hold(self, job_id: int) -> None:
        await self._scontrol("uhold", str(job_id))

    async def _set_excluded(self, job_id: int, hostlist: str) -> None:
        await self._scontrol("update", f"jobid={job_id}", f"excnodelist={hostlist}")

    async def _release(self, job_id: int) -> None:
        await self._scontrol("release", str(job_id))

    async def _start_now(self, job_id: int) -> None:
        await self._scontrol("update", f"jobid={job_id}", "starttime=now")

    async def run(
        self,
        tool: str,
        *args: str,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | None = None,
    ) -> CommandResult:
        """Run one Slurm command to completion.

        Args:
            tool: ``squeue``, ``sinfo``, ``scontrol`` or ``sbatch`` (resolved in ``bin_dir`` or on ``PATH``).
            *args: Its arguments, passed as they are (no shell).
            stdin: What the command reads on stdin (sbatch's script); None: nothing.
            env: The command's environment instead of the adapter's (sbatch's: the job's).
            stdout: A file the command writes its output to (``squeue``'s 40 MB at 10,000 jobs then never pass
                through the event loop); the result's ``stdout`` is then empty.

        Returns:
            The exit status and output; a non-zero status is not an error here.

        Raises:
            ReboundError: ``CONFIGURATION`` (missing binary or ``SLURM_CONF``), ``SCHEDULER_TIMEOUT``.
        """
        self._check_slurm_conf()
        argv = (self._resolve(tool), *args)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if stdout is None else stdout,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env) if env is not None else self._env,
            )
        except OSError as e:  # vanished or not executable between resolving and starting
            raise ReboundError(FailureKind.CONFIGURATION, f"cannot run {argv[0]}: {e}") from e
        try:
            async with asyncio.timeout(self._timeout_s):
                out, stderr = await proc.communicate(stdin)
        except TimeoutError as e:
            _kill(proc)
            await proc.wait()
            raise ReboundError(
                FailureKind.SCHEDULER_TIMEOUT, f"{' '.join((tool, *args))} ran past {self._timeout_s:g} s"
            ) from e
        except BaseException:
            _kill(proc)  # cancelled: never leave the command running behind a dead activity
            raise
        return CommandResult(argv, proc.returncode or 0, out or b"", stderr.decode("utf-8", "replace"))

    async def _read_output(self, tool: str, *args: str, stdout: IO[bytes] | None = None) -> bytes:
        """The command's stdout once it exited 0 (empty when it went to ``stdout``).

        Raises:
            ReboundError: As ``run``, and the classified failure of a non-zero exit.
        """
        result = await self.run(tool, *args, stdout=stdout)
        command = " ".join((tool, *args))
        if result.returncode != 0:
            kind = kind_from_text(result.stderr)
            if kind is FailureKind.SCHEDULER_REJECTED:
                # A read that fails for a reason we cannot name is retried: reading twice does no harm.
                kind = FailureKind.SCHEDULER_UNREACHABLE
            raise ReboundError(kind, f"{command} exited {result.returncode}: {_trim(result.stderr)}")
        return result.stdout

    async def _scontrol(self, *args: str) -> None:
        result = await self.run("scontrol", *args)
        if result.returncode != 0:
            text = result.stderr.strip() or result.stdout.decode("utf-8", "replace").strip()
            raise SlurmCallError(
                kind_from_text(text), f"scontrol {' '.join(args)}: {_trim(text)}", errno_from_text(text)
            )

    def _resolve(self, tool: str) -> str:
        if self._bin_dir is not None:
            path = self._bin_dir / tool
            if not os.access(path, os.X_OK) or not path.is_file():
                raise ReboundError(FailureKind.CONFIGURATION, f"{path} is missing or not executable")
            return str(path)
        search = (self._env if self._env is not None else os.environ).get("PATH")
        found = shutil.which(tool, path=search)
        if found is None:
            raise ReboundError(FailureKind.CONFIGURATION, f"{tool} not found on PATH ({search or 'unset'})")
        return found

    def _check_slurm_conf(self) -> None:
        conf = (self._env if self._env is not None else os.environ).get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            raise ReboundError(FailureKind.CONFIGURATION, f"SLURM_CONF={conf} does not exist")


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it exited on its own meanwhile
            proc.kill()


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _STDERR_LIMIT else text[:_STDERR_LIMIT] + "..."
