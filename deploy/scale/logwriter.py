"""The scale benchmark's log writer: one process appending every synthetic rank's step lines, one a second.

Each running job's R ranks write to ``LOG_ROOT/job-<id>/rank-<r>.log`` (the files the job's opt-in comment names)
the demo trainer's line (``deploy.demo.common.log_line``, a format the progress rules know)::

    2026-12-02T07:50:01.123Z [INFO] rank=3/8 node=g00001 step=120 loss=0.4123 step_time=1.000s compute_time=0.800s

It takes commands on stdin, one JSON object a line, and answers each on stdout with when it took effect:

* ``{"op": "run", "job": J, "node": N, "restart": K, "id": I}``: the job's ranks (re)start writing (an attempt);
* ``{"op": "stop", "job": J, "id": I}``: they stop (the job ended or was requeued);
* ``{"op": "hang", "job": J, "id": I}``: they stop while the job stays RUNNING; the answer's ``t`` is the time of
  the job's last step line (the true onset of the silence);
* ``{"op": "crash", "job": J, "rank": R, "id": I}``: rank R writes a CUDA crash (PyTorch's text) and every rank
  stops; ``t`` is when the lines were written.

Lines are appended with one ``open(O_APPEND)``/``write``/``close`` per file per second: a file descriptor per rank
would not fit the process's limit at thousands of jobs. Writing stops at ``--max-bytes`` (the tmpfs budget).

    python -m deploy.scale.logwriter LOG_ROOT --ranks 8 --max-bytes N
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.demo.common import log_line

__all__ = ["crash_lines", "rank_file", "step_line"]


def rank_file(log_root: Path, job_id: int, rank: int) -> Path:
    return log_root / f"job-{job_id}" / f"rank-{rank}.log"


def step_line(rank: int, ranks: int, node: str, step: int, now: float) -> str:
    """One rank's step line at ``now`` (loss falls slowly; compute time is 80 % of the 1 s step)."""
    loss = 2.0 / (1.0 + step / 500.0)
    message = f"step={step} loss={loss:.4f} step_time=1.000s compute_time=0.800s"
    return log_line("INFO", rank, ranks, node, message, now=now) + "\n"


def crash_lines(rank: int, ranks: int, node: str, now: float) -> str:
    """What a rank prints when an asynchronous CUDA error kills it (PyTorch's ``c10_cuda_check`` text)."""
    head = log_line("ERROR", rank, ranks, node, "step failed", now=now)
    body = [
        "Traceback (most recent call last):",
        '  File "/opt/train/train.py", line 342, in <module>',
        "    loss.backward()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.",
    ]
    return head + "\n" + "".join(f"[rank{rank}]: {line}\n" for line in body)


@dataclass
class _Job:
    node: str
    step: int = 0
    writing: bool = True
    last_line_at: float = 0.0


class _Writer:
    def __init__(self, log_root: Path, ranks: int, max_bytes: int) -> None:
        self.root, self.ranks, self.max_bytes = log_root, ranks, max_bytes
        self.jobs: dict[int, _Job] = {}
        self.written = 0
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()

    def append(self, path: Path, text: str) -> None:
        data = text.encode()
        if self.written + len(data) > self.max_bytes:
            return
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.written += len(data)

    def answer(self, ident: object, t: float) -> None:
        with self.out_lock:
            sys.stdout.write(json.dumps({"id": ident, "t": t}) + "\n")
            sys.stdout.flush()

    def command(self, cmd: dict[str, object]) -> None:
        op, job_id = cmd.get("op"), int(str(cmd.get("job", 0)))
        with self.lock:
            now = time.time()
            job = self.jobs.get(job_id)
            if op == "run":
                (self.root / f"job-{job_id}").mkdir(parents=True, exist_ok=True)
                step = job.step if job else 0
                self.jobs[job_id] = _Job(node=str(cmd.get("node", "")), step=step, last_line_at=now)
            elif op in ("stop", "hang") and job is not None:
                job.writing = False
                now = job.last_line_at if op == "hang" else now
            elif op == "crash" and job is not None:
                job.writing = False
                rank = int(str(cmd.get("rank", 0)))
                self.append(rank_file(self.root, job_id, rank), crash_lines(rank, self.ranks, job.node, now))
        self.answer(cmd.get("id"), now)

    def tick(self) -> None:
        with self.lock:
            now = time.time()
            for job_id, job in self.jobs.items():
                if not job.writing:
                    continue
                job.step += 1
                job.last_line_at = now
                for rank in range(self.ranks):
                    self.append(
                        rank_file(self.root, job_id, rank), step_line(rank, self.ranks, job.node, job.step, now)
                    )


def _read_commands(writer: _Writer, done: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip():
            writer.command(json.loads(line))
    done.set()  # the benchmark closed the pipe: stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.scale.logwriter")
    parser.add_argument("log_root", type=Path)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    writer = _Writer(args.log_root, args.ranks, args.max_bytes)
    done = threading.Event()
    threading.Thread(target=_read_commands, args=(writer, done), daemon=True).start()
    next_at = time.monotonic()
    while not done.is_set():
        writer.tick()
        next_at += args.interval_s
        done.wait(max(0.0, next_at - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
