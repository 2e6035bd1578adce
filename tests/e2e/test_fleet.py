"""End to end on the test lab: the Fleet as the single writer of node quarantine.

* Two jobs share a node whose GPU faults: both ask the Fleet, the node is drained once, both jobs restart
  elsewhere.
* Three of four nodes fault at once: the breaker (one drain per hour on 4 nodes) drains one, holds the other two
  for an operator's approval, and nothing else is drained; an operator's approval sent after a worker kill
  completes the held drains.
* A node drained by an administrator is evidence: Rebound keeps the job off it, never drains it again and never
  resumes it.

Every claim is checked against slurmctld's own log and a fresh ``sinfo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import pytest
from temporalio.client import Client

from deploy.local.fake_nvml_state import append_xid
from tests.e2e.recovery_support import (
    CtldLog,
    Recovery,
    incident_of,
    settle_leftovers,
    sigkill_worker,
    sinfo_drains,
    slurm_job,
    submit_tracked_demo,
)
from tests.lab_support import LabHandle, lab_rebound_settings, operator_env
from tests.security.redteam import RedTeamUser
from workers.client import connect
from workers.fleet_cli import fleet_status
from workflows.domain.fleet import ApprovalOutcome, FleetStatus, NodeLifecycle
from workflows.domain.incident import ActionKind
from workflows.domain.slurm import JobState

pytestmark = pytest.mark.slow

#: Drained, or drained and held for repair (a node of earlier tests' incidents may count as a lemon by now).
QUARANTINED = (NodeLifecycle.DRAINED, NodeLifecycle.HELD)


async def _client(lab: LabHandle) -> Client:
    client = await connect(lab_rebound_settings(lab).temporal)
    await settle_leftovers(lab, client)
    return client


async def _running(lab: LabHandle, rec: Recovery, timeout_s: float = 60) -> None:
    await rec.wait_watching(timeout_s=timeout_s)
    lab.wait_for(rec.job.has_checkpoint, 60)


def _rebound(lab: LabHandle, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(lab.slurm_env)
    env.update(
        REBOUND_CLUSTER_NAME=lab.cfg.cluster_name,
        REBOUND_TEMPORAL__ADDRESS=lab.cfg.temporal_address,
        REBOUND_TEMPORAL__NAMESPACE=lab.cfg.temporal_namespace,
        REBOUND_AUTH__MUNGE_SOCKET=str(lab.layout.munge_socket),  # every operator action is signed with MUNGE
        REBOUND_CONFIG=str(lab.layout.rebound_config),
    )
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def _wait_status(client: Client, lab: LabHandle, pred: object, what: str, timeout_s: float = 60) -> FleetStatus:
    assert callable(pred)
    settings = lab_rebound_settings(lab)
    deadline = asyncio.get_running_loop().time() + timeout_s
    st: FleetStatus | None = None
    while asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(Exception):
            st = await fleet_status(client, settings)
            if pred(st):
                return st
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last Fleet status: {st}")


def _reset_gpus(lab: LabHandle) -> None:
    for node in lab.cfg.node_names:
        lab.lab.rebound.reset_gpus(node)


async def test_two_jobs_sharing_a_bad_node_drain_it_once_and_both_restart_elsewhere(lab: LabHandle) -> None:
    client = await _client(lab)
    # No -w: a pinned job could not be restarted elsewhere. Instead two nodes are held by "an administrator" while
    # the jobs start, so both land on the other two (the 1-node job beside the 2-node one: 2 of 4 CPUs and GPUs
    # are free there), and are released once they run.
    spare = ("n3", "n4")
    for node in spare:
        lab.slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=e2e: placement")
    a = submit_tracked_demo(lab, "share-a")
    b = submit_tracked_demo(lab, "share-b", nodes=1)
    ra, rb = Recovery(lab, client, a), Recovery(lab, client, b)
    try:
        try:
            await asyncio.gather(rb.wait_watching(timeout_s=60), ra.wait_watching(timeout_s=60))
        finally:
            for node in spare:
                lab.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        await asyncio.gather(_running(lab, ra), _running(lab, rb))
        ja, jb = await slurm_job(lab, a.job_id), await slurm_job(lab, b.job_id)
        shared = sorted(set(ja.nodes) & set(jb.nodes))
        assert len(shared) == 1, (ja.nodes, jb.nodes)
        bad = shared[0]
        mark = CtldLog.mark(lab)
        append_xid(lab.layout.nvml_state(bad), 3, 48)  # a double-bit ECC error on a GPU of the shared node
        sta, stb = await asyncio.gather(ra.wait_resumed(timeout_s=90), rb.wait_resumed(timeout_s=90))
        # One drain of the shared node in slurmctld's log, by one of the two incidents; each job requeued once.
        assert [n for n, _ in mark.drains()] == [bad], mark.drains()
        assert mark.requeues(a.job_id) == 1 and mark.requeues(b.job_id) == 1
        for st in (sta, stb):
            inc = incident_of(st, 1)
            assert inc is not None and inc.attribution is not None
            assert inc.attribution.implicated_nodes == (bad,), inc.attribution
        drained_by = [
            i.id for st in (sta, stb) for i in st.incidents if any(a.kind is ActionKind.DRAIN for a in i.actions)
        ]
        assert len(drained_by) == 1, drained_by
        for job in (a, b):
            now = await slurm_job(lab, job.job_id)
            assert now.state is JobState.RUNNING and bad not in now.nodes, now
        fleet = await fleet_status(client, lab_rebound_settings(lab))
        rec = fleet.state.nodes[bad]
        assert rec.state in QUARANTINED and {a.job_id, b.job_id} <= {i.job_id for i in rec.incidents}, rec
        print(f"shared node {bad}: drained once ({drained_by[0]}); jobs {a.job_id}, {b.job_id} resumed elsewhere")
    finally:
        await asyncio.gather(ra.retire(), rb.retire())
        _reset_gpus(lab)


async def test_three_nodes_failing_at_once_hold_at_the_cap_and_an_approval_after_a_worker_kill_completes(
    lab: LabHandle, redteam_user: RedTeamUser
) -> None:
    client = await _client(lab)
    job = submit_tracked_demo(lab, "breaker", nodes=4, tasks_per_node=1)
    rec = Recovery(lab, client, job)
    try:
        await _running(lab, rec)
        mark = CtldLog.mark(lab)
        for node in ("n1", "n2", "n3"):  # three nodes' GPUs fault together: a shared cause, or a bad day
            append_xid(lab.layout.nvml_state(node), 0, 48)
        st = await _wait_status(
            client, lab, lambda s: any(a.outcome is ApprovalOutcome.PENDING for a in s.state.approvals),
            "an approval requested",
        )  # fmt: skip
        pending = next(a for a in st.state.approvals if a.outcome is ApprovalOutcome.PENDING)
        drained = [n for n, _ in mark.drains()]
        assert len(drained) == 1 and st.breaker.open and st.breaker.cap == 1, (drained, st.breaker)
        assert set(pending.nodes) == {"n1", "n2", "n3"} - set(drained), pending
        assert set(sinfo_drains(lab)) == set(drained), sinfo_drains(lab)
        # Findable in the UI: the Fleet carries the pending approval id as a search attribute.
        # (visibility is updated after the workflow task that upserts it, so give it a few seconds)
        found: list[str] = []
        for _ in range(50):
            found = [wf.id async for wf in client.list_workflows(f'ReboundPendingApproval = "{pending.id}"')]
            if found:
                break
            await asyncio.sleep(0.2)
        assert found, "no workflow with the pending approval in its search attributes"
        # The CLI shows it; a non-operator is refused.
        shown = _rebound(lab, "nodes")
        assert shown.returncode == 0 and pending.id in shown.stdout, shown
        refused = redteam_user.rebound("approve", pending.id, "--as", "lab", env=operator_env(lab))
        assert refused.returncode == 5 and "is not an operator" in refused.stderr, refused
        await asyncio.sleep(3)
        assert [n for n, _ in mark.drains()] == drained, "the breaker let another drain through"

        # Kill the worker while the approval waits; start a new one; approve: the held drains complete.
        sigkill_worker(lab)
        lab.lab.rebound.start()
        approved = _rebound(lab, "approve", pending.id, "--as", "lab", "--note", "e2e: confirmed bad GPUs")
        assert approved.returncode == 0, approved
        await _wait_status(
            client, lab, lambda s: all(s.state.nodes[n].state in QUARANTINED for n in pending.nodes),
            "the approved drains done",
        )  # fmt: skip
        assert sorted(n for n, _ in mark.drains()) == ["n1", "n2", "n3"], mark.drains()
        # The job's own record shows the drains done after the approval (timeline, audit, incidents).
        job_st = await rec.wait(
            lambda s: (
                (i := incident_of(s, 1)) is not None
                and sorted(a.target for a in i.actions if a.kind is ActionKind.DRAIN) == ["n1", "n2", "n3"]
            ),
            30,
            "the approved drains in the job's incident",
        )
        assert any("after approval" in e.detail for e in job_st.timeline), rec.describe()
        print(f"breaker: drained {drained} at once, held {list(pending.nodes)} for {pending.id}; approved after a "
              "worker kill: drained")  # fmt: skip
    finally:
        await rec.retire()
        _reset_gpus(lab)


async def test_a_node_drained_by_an_administrator_is_evidence_and_never_resumed(lab: LabHandle) -> None:
    client = await _client(lab)
    job = submit_tracked_demo(lab, "admin")
    rec = Recovery(lab, client, job)
    bad = "?"
    try:
        await _running(lab, rec)
        bad = (await slurm_job(lab, job.job_id)).nodes[-1]
        lab.slurm("scontrol", "update", f"nodename={bad}", "state=drain", "reason=admin: reseat DIMM 3")
        mark = CtldLog.mark(lab)
        append_xid(lab.layout.nvml_state(bad), 1, 48)
        st = await rec.wait_resumed(timeout_s=90)
        inc = incident_of(st, 1)
        assert inc is not None, rec.describe()
        assert not [a for a in inc.actions if a.kind is ActionKind.DRAIN], inc.actions
        assert mark.drains() == [], mark.drains()
        now = await slurm_job(lab, job.job_id)
        assert bad not in now.nodes, now
        fleet = await fleet_status(client, lab_rebound_settings(lab))
        assert fleet.state.nodes[bad].state is NodeLifecycle.EXTERNAL, fleet.state.nodes[bad]
        assert sinfo_drains(lab)[bad] == "admin: reseat DIMM 3"
    finally:
        await rec.retire()
        if bad != "?":
            lab.slurm("scontrol", "update", f"nodename={bad}", "state=resume", check=False)
        _reset_gpus(lab)
