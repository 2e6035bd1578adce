"""A stand-in for one rank of a hung training job, run as a real process by the live tests.

Its rank comes from the environment, as a real rank's does (``RANK`` or ``SLURM_PROCID``). Every rank but
``--sleeper`` waits in ``all_reduce_wait`` (as peers wait in a collective for a rank that never arrives); the
sleeper sits in ``time.sleep`` inside ``load_next_batch``. It prints ``ready <pid> <rank>`` just before blocking.
With ``--launch N`` it is a torchrun-like launcher instead: it starts N copies of itself with ``RANK`` and
``LOCAL_RANK`` set (its own ``SLURM_PROCID`` being the node's index) and waits for them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time


def all_reduce_wait() -> None:
    threading.Event().wait()


def load_next_batch() -> None:
    time.sleep(3600)


def launch(workers: int, sleeper: int) -> None:
    base = int(os.environ["SLURM_PROCID"]) * workers
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--sleeper", str(sleeper)],
            env=dict(os.environ, RANK=str(base + i), LOCAL_RANK=str(i)),
        )
        for i in range(workers)
    ]
    for child in children:
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleeper", type=int, default=-1, help="the rank that sleeps instead of waiting")
    parser.add_argument("--launch", type=int, default=0, help="start this many RANK workers and wait")
    args = parser.parse_args()
    if args.launch:
        launch(args.launch, args.sleeper)
        return
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-1")))
    # One write of the whole line: sibling workers share the pipe, and print() under PYTHONUNBUFFERED writes the
    # text and its newline separately, so their lines could interleave.
    sys.stdout.write(f"ready {os.getpid()} {rank}\n")
    sys.stdout.flush()
    if rank == args.sleeper:
        load_next_batch()
    else:
        all_reduce_wait()


if __name__ == "__main__":
    main()
