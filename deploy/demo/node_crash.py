"""Simulated host crash of a lab node: its slurmd, its slurmstepds and their task trees stop existing at once.

Two modes, because every lab node shares one kernel:

- ``kill`` (default; the lab's ``crash`` mode): everything is SIGKILLed. The kernel then closes the dead ranks'
  sockets, so surviving ranks on other nodes get "Connection reset/closed by peer" within milliseconds and exit,
  which a real crashed host (no FIN, no RST) would not cause.
- ``frozen_tasks=True``: only slurmd is SIGKILLed (so the lab can restart it); the stepds and the job's
  processes stay SIGSTOPped with their sockets open, so peers hang inside all_reduce as they do when a real host
  dies, and nothing reports to srun. (Killing the stepds would not do: Slurm tasks die with their stepd.) A
  detached reaper SIGKILLs them as soon as a new slurmd of the node starts ("the host rebooted") or after
  ``reap_after_s``, whichever is first.

Either way everything is frozen first, so no process of the "host" can react (a stepd reporting its tasks'
deaths would make srun see task failures instead of a node failure). t0 is the freeze.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from deploy.demo.common import RankInfo
from deploy.demo.injections import (
    InjectionRecord,
    NodeNotRunningError,
    append_record,
    new_id,
    run_paths,
    utc_datetime,
)
from deploy.demo.procs import (
    all_pids,
    find_node_processes,
    is_alive,
    option_value,
    proc_start_ticks,
    read_cmdline,
    read_pid_file,
    runs_program,
)
from deploy.local.layout import LabLayout

DEFAULT_REAP_AFTER_S = 600.0
_REPO_ROOT = Path(__file__).resolve().parents[2]


def inject_node_crash(
    layout: LabLayout,
    node: str,
    *,
    run: str | None = None,
    frozen_tasks: bool = False,
    reap_after_s: float = DEFAULT_REAP_AFTER_S,
) -> InjectionRecord:
    """Crash ``node``: its slurmd (from its pid file), its slurmstepds (they hold its slurmd log open) and every
    descendant of those stepds.

    Args:
        layout: the lab.
        node: the node name (``n2``).
        run: only annotates the record with the run and its job id.
        frozen_tasks: leave the stepds and the job's processes stopped instead of killed (module docstring).
        reap_after_s: with ``frozen_tasks``, the longest the stopped processes are kept.

    Raises:
        NodeNotRunningError: no live slurmd for the node.
        UnknownRunError: ``run`` given but unknown.
    """
    pid_file = layout.pid_file(f"slurmd-{node}")
    found = find_node_processes(pid_file, layout.slurmd_log(node))
    if found.slurmd is None:
        stale = read_pid_file(pid_file)
        detail = f"pid file {pid_file} missing" if stale is None else f"pid {stale} from {pid_file} is not slurmd"
        raise NodeNotRunningError(f"node {node} has no running slurmd: {detail}")
    job_id = restart = None
    if run is not None:
        for path in sorted(run_paths(layout, run).ranks.glob("rank-*.json")):
            try:
                info = RankInfo.model_validate_json(path.read_bytes())
            except (OSError, ValidationError):
                continue
            job_id, restart = info.job_id, info.restart
            break

    t0 = time.time()
    _signal_all(found.all, signal.SIGSTOP)
    # A stepd may have forked between the scan and the freeze; the frozen tree is stable, so look once more.
    again = find_node_processes(pid_file, layout.slurmd_log(node))
    known = set(found.all)
    late_tasks = [pid for pid in again.tasks if pid not in known]
    late_stepds = [pid for pid in again.stepds if pid not in known]
    _signal_all(late_tasks + late_stepds, signal.SIGSTOP)
    daemons = [found.slurmd, *found.stepds, *late_stepds]
    tasks = found.tasks + late_tasks
    if frozen_tasks:
        # Only slurmd dies now (its stale pid file lets the lab restart it). The stepds stay frozen too: Slurm
        # tasks die with their stepd (parent-death signal), which would close their sockets after all.
        _signal_all([found.slurmd], signal.SIGKILL)
        _spawn_reaper(daemons[1:] + tasks, node, layout.slurm_conf, pid_file, found.slurmd, reap_after_s)
    else:
        _signal_all(daemons + tasks, signal.SIGKILL)
    record = InjectionRecord(
        id=new_id("node-crash"),
        kind="node-crash",
        run=run,
        job_id=job_id,
        restart=restart,
        rank=None,
        node=node,
        gpu=None,
        xid=None,
        pids=daemons + tasks,
        t0=utc_datetime(t0),
        t0_epoch=t0,
        injected_at=utc_datetime(t0),
    )
    append_record(layout, record)
    return record


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue  # already gone: nothing left to do for it


def _spawn_reaper(
    targets: list[int], node: str, slurm_conf: Path, pid_file: Path, old_slurmd: int, reap_after_s: float
) -> None:
    """Start the reaper detached (own session, no inherited pipes), so it outlives the injector's caller."""
    pairs = [f"{pid}:{start}" for pid in targets if (start := proc_start_ticks(pid)) is not None]
    if not pairs:
        return
    cmd = [sys.executable, "-m", "deploy.demo.node_crash", "--node", node, "--slurm-conf", str(slurm_conf)]
    cmd += ["--pid-file", str(pid_file), "--old-slurmd", str(old_slurmd), "--after", str(reap_after_s), *pairs]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def node_restarted(node: str, slurm_conf: Path, pid_file: Path, old_slurmd: int) -> bool:
    """Whether a new slurmd of ``node`` runs: named by the pid file, or (before it writes one) found by its
    command line ``-f <slurm_conf> -N <node>``.

    The command line matters: a restarting slurmd first contacts the node's old stepds, which are frozen, so it
    would wait on them before ever writing its pid file.
    """
    pid = read_pid_file(pid_file)
    if pid is not None and pid != old_slurmd and is_alive(pid) and runs_program(pid, "slurmd"):
        return True
    for candidate in all_pids():
        if candidate == old_slurmd or not runs_program(candidate, "slurmd") or not is_alive(candidate):
            continue
        argv = read_cmdline(candidate)
        conf = option_value(argv, "-f")
        if option_value(argv, "-N") == node and (conf is None or Path(conf) == slurm_conf):
            return True
    return False


def reap(
    targets: Sequence[tuple[int, int]], node: str, slurm_conf: Path, pid_file: Path, old_slurmd: int, after_s: float
) -> None:
    """Wait for the node's restart or the deadline, then SIGKILL the targets that are still the same processes."""
    deadline = time.monotonic() + after_s
    while time.monotonic() < deadline and not node_restarted(node, slurm_conf, pid_file, old_slurmd):
        time.sleep(0.25)
    _signal_all([pid for pid, start in targets if proc_start_ticks(pid) == start], signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """The detached reaper: ``python -m deploy.demo.node_crash --node N --slurm-conf F --pid-file F
    --old-slurmd P --after S PID:START...``."""
    parser = argparse.ArgumentParser(prog="python -m deploy.demo.node_crash")
    parser.add_argument("--node", required=True)
    parser.add_argument("--slurm-conf", type=Path, required=True)
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--old-slurmd", type=int, required=True)
    parser.add_argument("--after", type=float, required=True)
    parser.add_argument("targets", nargs="+", help="PID:START_TICKS of each frozen process")
    args = parser.parse_args(argv)
    targets = [(int(p), int(s)) for p, s in (t.split(":", 1) for t in args.targets)]
    reap(targets, args.node, args.slurm_conf, args.pid_file, args.old_slurmd, args.after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
