"""The synthetic cluster behind Slurm's own command names, for Rebound's real CLI adapter.

``slurm.bin_dir`` (``REBOUND_SLURM__BIN_DIR``) points the worker and the node agents at a directory holding:

* ``squeue``/``sinfo``: ``cat`` of the listing the benchmark rewrites (atomically: a reader never sees half a file)
  whenever the cluster changes, so what the worker parses is exactly ``SyntheticCluster.squeue()``;
* ``scontrol``: a small stdlib client that hands its arguments to the benchmark over a unix socket and prints the
  answer, so a requeue or a drain changes the listings before ``scontrol`` returns (as Slurm's do);
* ``sbatch``: refused (resubmission is not modelled: every synthetic job may be requeued).

Every ``scontrol`` call is recorded (time, arguments, exit status).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.scale.cluster import JobChange, SyntheticCluster
from deploy.scale.records import META

__all__ = ["FakeSlurm"]

_CLIENT = """#!{python} -IS
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({socket!r})
s.sendall(json.dumps(sys.argv[1:]).encode() + b"\\n")
data = b""
while not data.endswith(b"\\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
answer = json.loads(data or b'{{"rc": 1, "stdout": "", "stderr": "scontrol: no answer from the benchmark"}}')
sys.stdout.write(answer["stdout"])
sys.stderr.write(answer["stderr"])
sys.exit(answer["rc"])
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _cached(
    cache: dict[Any, tuple[tuple[Any, ...], str]], key: Any, fingerprint: tuple[Any, ...], render: Callable[[], Any]
) -> str:
    """The record's JSON, rendered again only when its fingerprint changed (Slurm indents by 3)."""
    hit = cache.get(key)
    if hit is not None and hit[0] == fingerprint:
        return hit[1]
    text = json.dumps(render(), indent=3)
    cache[key] = (fingerprint, text)
    return text


def _atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


class FakeSlurm:
    """Serves ``cluster`` through fake Slurm commands in ``root/bin``; ``on_change`` hears every job change."""

    def __init__(self, cluster: SyntheticCluster, root: Path, on_change: Callable[[JobChange], None]) -> None:
        self.cluster = cluster
        self.root = root
        self.bin_dir = root / "bin"
        self.socket_path = root / "scontrol.sock"
        self.on_change = on_change
        self.commands: list[dict[str, Any]] = []
        self._jobs_cache: dict[int, tuple[tuple[Any, ...], str]] = {}
        self._nodes_cache: dict[str, tuple[tuple[Any, ...], str]] = {}
        self._server: asyncio.AbstractServer | None = None

    def install(self) -> None:
        """Write the commands and the first listings."""
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for tool in ("squeue", "sinfo"):
            _executable(self.bin_dir / tool, f"#!/bin/sh\nexec cat {self.root / (tool + '.json')}\n")
        _executable(self.bin_dir / "scontrol", _CLIENT.format(python=sys.executable, socket=str(self.socket_path)))
        _executable(
            self.bin_dir / "sbatch", "#!/bin/sh\necho 'sbatch: the scale benchmark submits nothing' >&2\nexit 1\n"
        )
        self.publish()

    def publish(self) -> None:
        """Rewrite both listings (only the records that changed are rendered again)."""
        c = self.cluster
        busy = c.busy_nodes()
        jobs = [
            _cached(self._jobs_cache, j.job_id, dataclasses.astuple(j), lambda j=j: c.job_json(j))  # type: ignore[misc]
            for j in c.jobs.values()
        ]
        nodes = [
            _cached(
                self._nodes_cache,
                n.name,
                (*dataclasses.astuple(n), n.name in busy),
                lambda n=n: c.node_json(n, allocated=n.name in busy),  # type: ignore[misc]
            )
            for n in c.nodes.values()
        ]
        head = '{"meta": ' + json.dumps(META) + ', "errors": [], '
        _atomic(self.root / "squeue.json", head + '"jobs": [' + ",".join(jobs) + "]}\n")
        _atomic(self.root / "sinfo.json", head + '"nodes": [' + ",".join(nodes) + "]}\n")

    def changed(self, changes: tuple[JobChange, ...]) -> None:
        for change in changes:
            self.on_change(change)
        if changes:
            self.publish()

    def tick(self) -> None:
        self.changed(self.cluster.tick(time.time()))

    def fail(self, job_id: int) -> None:
        self.changed(self.cluster.fail(job_id))

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            argv = json.loads(await reader.readline())
            now = time.time()
            outcome = self.cluster.scontrol([str(a) for a in argv], now)
            self.changed(outcome.changes)
            self.publish()  # a drain or an exclusion changes the listings too
            self.commands.append({"t": now, "argv": argv, "rc": outcome.returncode, "stderr": outcome.stderr.strip()})
            answer = {"rc": outcome.returncode, "stdout": outcome.stdout, "stderr": outcome.stderr}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except ConnectionError:
            pass  # the caller went away (killed, timed out, the run's teardown): its command is applied and recorded
        finally:
            writer.close()
