"""The scale benchmark's synthetic Slurm cluster: N one-node jobs of R ranks, spare nodes, and the scheduler
commands Rebound issues, modelled on Slurm 22.05's observed behaviour (pure: the caller passes the clock).

What is modelled (texts and error messages as captured on the lab, ``tests/data/slurm/scontrol_errors.json``):

* ``scontrol requeue|requeuehold J``: a running or ended job goes back to PENDING at once (Slurm passes through
  COMPLETING for about a second), its restart count + 1, its node freed; ``requeuehold`` holds it (JobHeldUser).
  A pending job: "Job is pending execution".
* ``uhold J``, ``release J``; ``update jobid=J excnodelist=H`` and ``starttime=now`` only while pending ("Job is no
  longer pending execution" otherwise).
* ``update nodename=N state=drain reason=R`` (a reason is required) and ``state=resume`` (only a drained node).
* ``ping``, ``show config`` (without ``StateSaveLocation``: no saved environment), ``write batch_script J -``.
* A released job starts after ``start_delay_s`` (1 s with ``starttime=now``) on its previous node when that is
  free, not drained and not excluded, else on a free spare; with none, it stays PENDING (Resources).

Anything else is refused (exit 1) and counted, so the report shows a command the model does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from activities.slurm.hostlist import HostlistError, expand
from deploy.scale.records import META, job_record, node_record

__all__ = ["CommandOutcome", "JobChange", "SynthJob", "SynthNode", "SyntheticCluster", "opt_in_comment"]

_HELD = "JobHeldUser"


def opt_in_comment(log_root: str) -> str:
    """The job's opt-in: Rebound's comment with its ranks' log files (``%j`` the job, ``%t`` the rank)."""
    return f"rebound: logs={log_root}/job-%j/rank-%t.log"


@dataclass
class SynthJob:
    job_id: int
    name: str
    node: str
    state: str = "RUNNING"
    restart_count: int = 0
    submit_time: int = 0
    start_time: int = 0
    held: bool = False
    reason: str = "None"
    excluded: tuple[str, ...] = ()
    exit_code: int = 0
    released_at: float = 0.0
    start_now: bool = False


@dataclass
class SynthNode:
    name: str
    drain: bool = False
    reason: str = ""
    reason_by: str | None = None
    reason_at: int = 0


@dataclass(frozen=True)
class JobChange:
    """A job's ranks start (a new attempt on ``node``) or stop writing: what the log writer must be told."""

    job_id: int
    running: bool
    node: str = ""
    restart_count: int = 0


@dataclass(frozen=True)
class CommandOutcome:
    returncode: int
    stdout: str = ""
    stderr: str = ""
    changes: tuple[JobChange, ...] = ()


@dataclass
class SyntheticCluster:
    """The cluster's state. Build with ``SyntheticCluster.create``; every method takes ``now`` (epoch seconds)."""

    jobs: dict[int, SynthJob]
    nodes: dict[str, SynthNode]
    ranks: int
    comment: str
    workdir: str
    user: tuple[str, int]
    boot_time: int
    start_delay_s: float = 5.0
    unknown_commands: list[str] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        *,
        jobs: int,
        ranks: int,
        spare_nodes: int,
        log_root: str,
        user: tuple[str, int],
        now: float,
        first_job_id: int = 1000,
    ) -> SyntheticCluster:
        """``jobs`` running jobs, one node each (``g00001``...), plus ``spare_nodes`` idle ones."""
        width = max(5, len(str(jobs + spare_nodes)))
        names = [f"g{i:0{width}d}" for i in range(1, jobs + spare_nodes + 1)]
        started = int(now)
        synth = {
            first_job_id + i: SynthJob(
                job_id=first_job_id + i,
                name=f"train-{i:05d}",
                node=names[i],
                submit_time=started - 60,
                start_time=started,
            )
            for i in range(jobs)
        }
        return cls(
            jobs=synth,
            nodes={n: SynthNode(n) for n in names},
            ranks=ranks,
            comment=opt_in_comment(log_root),
            workdir=log_root,
            user=user,
            boot_time=started - 3600,
        )

    # ------------------------------------------------------------------ listings

    def squeue(self) -> dict[str, Any]:
        """What ``squeue --json`` prints now."""
        return {"meta": META, "errors": [], "jobs": [self.job_json(j) for j in self.jobs.values()]}

    def sinfo(self) -> dict[str, Any]:
        """What ``sinfo --json`` prints now."""
        busy = self.busy_nodes()
        return {
            "meta": META,
            "errors": [],
            "nodes": [self.node_json(n, allocated=n.name in busy) for n in self.nodes.values()],
        }

    def node_json(self, n: SynthNode, *, allocated: bool) -> dict[str, Any]:
        """One node's ``sinfo --json`` record."""
        return node_record(
            name=n.name,
            gpus=self.ranks,
            allocated=allocated,
            drain=n.drain,
            reason=n.reason,
            reason_by=n.reason_by,
            reason_at=n.reason_at,
            boot_time=self.boot_time,
            port=6818,
        )

    def job_json(self, j: SynthJob) -> dict[str, Any]:
        """One job's ``squeue --json`` record."""
        return job_record(
            job_id=j.job_id,
            name=j.name,
            state=j.state,
            node=j.node,
            gpus=self.ranks,
            comment=self.comment,
            user=self.user,
            workdir=self.workdir,
            submit_time=j.submit_time,
            start_time=j.start_time,
            restart_count=j.restart_count,
            state_reason=j.reason,
            excluded=",".join(j.excluded),
            exit_code=j.exit_code,
        )

    def busy_nodes(self) -> set[str]:
        return {j.node for j in self.jobs.values() if j.state == "RUNNING" and j.node}

    # ------------------------------------------------------------------ faults and scheduling

    def fail(self, job_id: int, *, exit_status: int = 256) -> tuple[JobChange, ...]:
        """The job's ranks died: FAILED with ``exit_status`` (a raw wait status: 256 is exit 1)."""
        job = self.jobs[job_id]
        if job.state != "RUNNING":
            return ()
        job.state, job.exit_code, job.reason = "FAILED", exit_status, "NonZeroExitCode"
        return (JobChange(job_id, running=False),)

    def tick(self, now: float) -> tuple[JobChange, ...]:
        """Start the released pending jobs whose wait is over; returns the jobs that started."""
        changes: list[JobChange] = []
        busy = self.busy_nodes()
        for job in self.jobs.values():
            if job.state != "PENDING" or job.held:
                continue
            if now - job.released_at < (1.0 if job.start_now else self.start_delay_s):
                continue
            node = self._place(job, busy)
            if node is None:
                job.reason = "Resources"
                continue
            busy.add(node)
            job.state, job.node, job.start_time, job.reason = "RUNNING", node, int(now), "None"
            job.start_now, job.exit_code = False, 0
            changes.append(JobChange(job.job_id, running=True, node=node, restart_count=job.restart_count))
        return tuple(changes)

    def _place(self, job: SynthJob, busy: set[str]) -> str | None:
        def usable(name: str) -> bool:
            return name not in busy and name not in job.excluded and not self.nodes[name].drain

        if job.node and job.node in self.nodes and usable(job.node):
            return job.node
        return next((n for n in self.nodes if usable(n)), None)

    # ------------------------------------------------------------------ scontrol

    def scontrol(self, argv: Sequence[str], now: float) -> CommandOutcome:
        """Apply one ``scontrol`` command line (without the program name)."""
        args = list(argv)
        verb = args[0] if args else ""
        try:
            if verb == "ping" and len(args) == 1:
                return CommandOutcome(0, "Slurmctld(primary) at scale-ctl is UP\n")
            if args[:2] == ["show", "config"]:
                return CommandOutcome(0, "Configuration data as of now\nClusterName             = scale\n")
            if args[:2] == ["write", "batch_script"] and len(args) == 4:
                self._job(args[2])
                return CommandOutcome(0, "#!/bin/bash\n#SBATCH --gpus-per-node=8\nsrun python train.py\n")
            if verb in ("requeue", "requeuehold") and len(args) == 2:
                return self._requeue(self._job(args[1]), hold=verb == "requeuehold", now=now)
            if verb in ("uhold", "release") and len(args) == 2:
                return self._hold(self._job(args[1]), hold=verb == "uhold", now=now)
            if verb == "update" and len(args) >= 3:
                return self._update(dict(a.split("=", 1) for a in args[1:] if "=" in a), now)
        except _Refused as e:
            return CommandOutcome(1, stderr=str(e) + "\n")
        self.unknown_commands.append(" ".join(args))
        return CommandOutcome(1, stderr=f"scontrol: the benchmark's scheduler does not model: {' '.join(args)}\n")

    def _job(self, text: str) -> SynthJob:
        job = self.jobs.get(int(text)) if text.isdigit() else None
        if job is None:
            raise _Refused(f"Invalid job id specified for job {text}")
        return job

    def _requeue(self, job: SynthJob, *, hold: bool, now: float) -> CommandOutcome:
        if job.state == "PENDING":
            raise _Refused(f"Job is pending execution for job {job.job_id}")
        was_running = job.state == "RUNNING"
        job.state, job.restart_count, job.held = "PENDING", job.restart_count + 1, hold
        job.reason, job.released_at, job.exit_code, job.start_now = (_HELD if hold else "BeginTime"), now, 0, False
        return CommandOutcome(0, changes=(JobChange(job.job_id, running=False),) if was_running else ())

    def _hold(self, job: SynthJob, *, hold: bool, now: float) -> CommandOutcome:
        if job.state != "PENDING":
            raise _Refused(f"Job is no longer pending execution for job {job.job_id}")
        if not hold and job.held:
            job.released_at = now
        job.held, job.reason = hold, (_HELD if hold else "None")
        return CommandOutcome(0)

    def _update(self, fields: dict[str, str], now: float) -> CommandOutcome:
        lowered = {k.lower(): v for k, v in fields.items()}
        if "jobid" in lowered:
            job = self._job(lowered["jobid"])
            if job.state != "PENDING":
                raise _Refused(f"Job is no longer pending execution for job {job.job_id}")
            if "excnodelist" in lowered:
                job.excluded = self._node_names(lowered["excnodelist"], f"for job {job.job_id}")
                return CommandOutcome(0)
            if lowered.get("starttime") == "now":
                job.start_now = True
                return CommandOutcome(0)
        elif "nodename" in lowered and "state" in lowered:
            names = self._node_names(lowered["nodename"], "", prefix="slurm_update error: ")
            state = lowered["state"].lower()
            if state == "drain":
                if not lowered.get("reason", "").strip():
                    raise _Refused("You must specify a reason when DOWNING or DRAINING a node. Request denied")
                for name in names:
                    node = self.nodes[name]
                    node.drain, node.reason, node.reason_by, node.reason_at = True, lowered["reason"], "root", int(now)
                return CommandOutcome(0)
            if state == "resume":
                if not all(self.nodes[n].drain for n in names):
                    raise _Refused("slurm_update error: Invalid node state specified")
                for name in names:
                    self.nodes[name] = SynthNode(name)
                return CommandOutcome(0)
        self.unknown_commands.append("update " + " ".join(f"{k}={v}" for k, v in fields.items()))
        return CommandOutcome(1, stderr="scontrol: the benchmark's scheduler does not model this update\n")

    def _node_names(self, hostlist: str, where: str, *, prefix: str = "") -> tuple[str, ...]:
        if not hostlist:
            return ()
        try:
            names = expand(hostlist)
        except HostlistError:
            names = (hostlist,)
        if any(n not in self.nodes for n in names):
            raise _Refused(f"{prefix}Invalid node name specified {where}".rstrip())
        return tuple(names)


class _Refused(Exception):
    """A command Slurm would refuse, with Slurm's own message."""
