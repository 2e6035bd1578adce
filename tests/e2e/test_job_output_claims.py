"""End to end on the test lab: a job's output is a claim (issue 13, ``docs/security.md``).

* Two jobs of one user (root) share a node; a rank of each dies there with no hardware evidence. The first
  implication leaves a suspicion (the node excluded for that job); the second, by the same user's other job, does
  not drain the node for everyone (before issue 13 it did): the node is excluded for that job too, and the Fleet
  asks an operator (a pending drain approval whose reasons name the user). An operator's approval draining a held
  node is covered by ``test_fleet.py``.
* The same with the second job submitted by another Unix user (the red-team user, ``tests/security/redteam.py``):
  jobs of two different users implicating the node are evidence no one user can forge: it is drained, the reasons
  naming both users.

Every claim is checked against slurmctld's own log, a fresh ``sinfo`` and ``squeue``, and the Fleet's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

import pytest

from deploy.demo.common import RunPaths
from deploy.demo.inject import inject
from deploy.demo.injections import live_rank
from deploy.demo.submit import parse_job_id, sbatch_command, submit_env
from tests.e2e.recovery_support import (
    CtldLog,
    DemoJob,
    Recovery,
    actions_of,
    incident_of,
    settle_leftovers,
    sinfo_drains,
    slurm_job,
    submit_tracked_demo,
)
from tests.lab_support import LabHandle, lab_rebound_settings
from tests.security.redteam import RedTeamUser
from workers.client import connect
from workers.fleet_cli import fleet_status
from workflows.domain.fleet import ApprovalKind, ApprovalOutcome, FleetStatus
from workflows.domain.incident import ActionKind, ActionRung
from workflows.domain.recovery import JobRecoveryStatus

pytestmark = pytest.mark.slow


def _rank_on(lab: LabHandle, run: str, node: str, ranks: int) -> int:
    """The first live rank of the run on ``node``."""
    return next(r for r in range(ranks) if live_rank(lab.layout, run, r).node == node)


async def _fleet_until(
    lab: LabHandle, pred: Callable[[FleetStatus], bool], what: str, timeout_s: float = 90
) -> FleetStatus:
    client = await connect(lab_rebound_settings(lab).temporal)
    deadline = asyncio.get_running_loop().time() + timeout_s
    st: FleetStatus | None = None
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(Exception):  # no Fleet yet, a query timeout: try again
            st = await fleet_status(client, lab_rebound_settings(lab))
            if pred(st):
                return st
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last Fleet status: {st}")


async def test_two_jobs_of_one_user_crashing_on_one_node_drain_nothing_and_ask_an_operator(lab: LabHandle) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)  # a new Fleet: no suspicion of earlier tests
    # Two nodes held while the jobs start, so a 2-node and a 1-node job share one node (test_fleet.py's placement).
    spare = ("n3", "n4")
    for node in spare:
        lab.slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=e2e: placement")
    a = submit_tracked_demo(lab, "claim-a")
    b = submit_tracked_demo(lab, "claim-b", nodes=1)
    ra, rb = Recovery(lab, client, a), Recovery(lab, client, b)
    try:
        try:
            await asyncio.gather(rb.wait_watching(timeout_s=60), ra.wait_watching(timeout_s=60))
        finally:
            for node in spare:
                lab.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        lab.wait_for(a.has_checkpoint, 60)
        lab.wait_for(b.has_checkpoint, 60)
        ja, jb = await slurm_job(lab, a.job_id), await slurm_job(lab, b.job_id)
        shared = sorted(set(ja.nodes) & set(jb.nodes))
        assert len(shared) == 1 and ja.user and ja.user == jb.user, (ja.nodes, jb.nodes, ja.user, jb.user)
        bad, user = shared[0], ja.user
        mark = CtldLog.mark(lab)

        # Job a: a rank dies on the shared node with no hardware evidence: a suspicion, excluded for job a only.
        inject(lab.layout, "crash", run=a.run, rank=_rank_on(lab, a.run, bad, 4))
        sta = await ra.wait_resumed(timeout_s=90)
        inc_a = incident_of(sta, 1)
        assert inc_a is not None and inc_a.attribution is not None, ra.describe()
        assert inc_a.attribution.implicated_nodes == (bad,), ra.describe()
        assert inc_a.attribution.action is ActionRung.EXCLUDE, ra.describe()
        assert actions_of(inc_a, ActionKind.DRAIN) == [] and mark.drains() == [], mark.drains()

        # Job b, the same user's: its rank dies on the same node. Implicated again, only by this user's jobs: not
        # drained; excluded for job b; an operator is asked.
        inject(lab.layout, "crash", run=b.run, rank=_rank_on(lab, b.run, bad, 2))
        st = await _fleet_until(
            lab,
            lambda s: any(x.request.job_id == b.job_id for x in s.state.approvals),
            "job b's drain approval requested",
        )
        asked = next(x for x in st.state.approvals if x.request.job_id == b.job_id)
        assert asked.kind is ApprovalKind.DRAIN and asked.nodes == (bad,), asked
        assert asked.outcome is ApprovalOutcome.PENDING, asked
        claim = next(r for r in asked.reasons if "implicated again" in r)
        assert f"only by jobs of user {user}" in claim and "a job's output is a claim" in claim, claim
        suspicions = [(i.job_id, i.user) for i in st.state.nodes[bad].incidents if i.suspicion]
        assert suspicions == [(a.job_id, user), (b.job_id, user)], st.state.nodes[bad].incidents
        stb = await rb.wait_resumed(timeout_s=90)
        inc_b = incident_of(stb, 1)
        assert inc_b is not None and actions_of(inc_b, ActionKind.DRAIN) == [], rb.describe()
        assert mark.drains() == [] and bad not in sinfo_drains(lab), (mark.drains(), sinfo_drains(lab))
        for job in (a, b):
            now = await slurm_job(lab, job.job_id)
            assert bad in now.excluded_nodes and bad not in now.nodes, now
        print(
            f"{bad}: rank crashes of jobs {a.job_id} and {b.job_id} of {user}: not drained (slurmctld set no drain "
            f"reason), excluded for both, {asked.id} asks an operator"
        )
    finally:
        await asyncio.gather(ra.retire(), rb.retire())


def _submit_as(lab: LabHandle, user: RedTeamUser, name: str) -> DemoJob:
    """The demo (1 node x 2 ranks) submitted by ``user`` itself (``runuser``, its own interpreter): Slurm records
    it as that user's job, and its run directory and logs are that user's."""
    run = f"e2e-{name}-{int(time.time() * 1000) % 10**9}"
    paths = RunPaths(lab.layout.run_dir(run))
    paths.ensure()
    for d in (paths.run_dir, *paths.run_dir.rglob("*")):
        os.chown(d, user.uid, -1)
    spec = f"rebound: ckpt={paths.checkpoints};logs={paths.logs}/job-%j-*.log"
    cmd = sbatch_command(
        lab.layout, run, nodes=1, tasks_per_node=2, gpus_per_node=2, steps=100000, checkpoint_every=10,
        extra_sbatch_args=(f"--comment={spec}",),
    )  # fmt: skip
    done = user.run(cmd, submit_env(lab.layout, run, lab.slurm_env, python=str(user.python)))
    assert done.returncode == 0, done
    return DemoJob(lab, run, lab.track(parse_job_id(done.stdout)))


def _fleet_notes(st: JobRecoveryStatus, number: int) -> str:
    return " | ".join(e.detail for e in st.timeline if e.event == "FLEET" and e.incident == number)


async def test_jobs_of_two_users_crashing_on_one_node_drain_it_naming_both(
    lab: LabHandle, redteam_user: RedTeamUser
) -> None:
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)
    spare = ("n3", "n4")
    for node in spare:
        lab.slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=e2e: placement")
    a = submit_tracked_demo(lab, "users-a")
    b = _submit_as(lab, redteam_user, "users-b")
    ra, rb = Recovery(lab, client, a), Recovery(lab, client, b)
    try:
        try:
            await asyncio.gather(rb.wait_watching(timeout_s=60), ra.wait_watching(timeout_s=60))
        finally:
            for node in spare:
                lab.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        lab.wait_for(a.has_checkpoint, 60)
        lab.wait_for(b.has_checkpoint, 60)
        ja, jb = await slurm_job(lab, a.job_id), await slurm_job(lab, b.job_id)
        shared = sorted(set(ja.nodes) & set(jb.nodes))
        assert len(shared) == 1, (ja.nodes, jb.nodes)
        assert jb.user == redteam_user.name and ja.user and ja.user != jb.user, (ja.user, jb.user)
        bad = shared[0]
        mark = CtldLog.mark(lab)

        inject(lab.layout, "crash", run=a.run, rank=_rank_on(lab, a.run, bad, 4))
        sta = await ra.wait_resumed(timeout_s=90)
        inc_a = incident_of(sta, 1)
        assert inc_a is not None and inc_a.attribution is not None, ra.describe()
        assert inc_a.attribution.action is ActionRung.EXCLUDE and inc_a.attribution.implicated_nodes == (bad,)
        assert mark.drains() == [], mark.drains()

        # The other user's job implicates the same node: drained for everyone, both users named.
        inject(lab.layout, "crash", run=b.run, rank=_rank_on(lab, b.run, bad, 2))
        stb = await rb.wait_resumed(timeout_s=90)
        inc_b = incident_of(stb, 1)
        assert inc_b is not None and actions_of(inc_b, ActionKind.DRAIN) == [bad], rb.describe()
        users = " and ".join(sorted((ja.user, jb.user)))
        notes = _fleet_notes(stb, 1)
        assert f"{bad}: implicated again" in notes and f"implicated by jobs of users {users}" in notes, notes
        assert [n for n, _ in mark.drains()] == [bad], mark.drains()
        assert sinfo_drains(lab)[bad].startswith(f"rebound: {inc_b.id} "), sinfo_drains(lab)
        print(f"{bad}: rank crashes of job {a.job_id} ({ja.user}) and job {b.job_id} ({jb.user}): drained ({inc_b.id})")
    finally:
        await asyncio.gather(ra.retire(), rb.retire())
