"""The Fleet's I/O: reach the Fleet workflow from a JobRecovery (signal-with-start), read the cluster fresh, and
return a node to service only while it still carries Rebound's own drain reason."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import classified_errors
from activities.heartbeating import heartbeating_throughout
from activities.slurm.port import SchedulerPort
from activities.temporal.rebound_workflows import query_fleet_decision, signal_fleet_request
from workflows.constants import fleet_workflow_id
from workflows.domain.base import Frozen
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.fleet import FleetInput, FleetPolicy, IsolationDecision, IsolationRequest
from workflows.domain.fleet_view import FleetView, FleetViewInput
from workflows.domain.slurm import ClusterSnapshot
from workflows.policy.fleet.view import build_fleet_view

__all__ = ["FleetActivities", "ResumeNodeInput", "ResumeNodeResult"]


class ResumeNodeInput(Frozen):
    node: str
    expected_reason: str
    """Resume only while the node still carries exactly this (Rebound's) drain reason."""


class ResumeNodeResult(Frozen):
    node: str
    resumed: bool
    verified_at: datetime
    detail: str = ""


class FleetActivities:
    """Bound to a Temporal client (to reach the Fleet) and the scheduler port (fresh reads, resume)."""

    def __init__(
        self, client: Client | None, scheduler: SchedulerPort, *, cluster: str, task_queue: str, policy: FleetPolicy
    ) -> None:
        self._client = client
        self._scheduler = scheduler
        self._cluster = cluster
        self._task_queue = task_queue
        self._policy = policy

    @activity.defn(name="fleet_request_isolation")
    async def request_isolation(self, req: IsolationRequest) -> str:
        """Deliver ``req`` to the cluster's Fleet, starting it first if it is not running (signal-with-start).

        Idempotent: the Fleet answers a repeated request id with the decision it already made.
        """
        if self._client is None:
            raise ReboundError(FailureKind.CONFIGURATION, "this worker has no Temporal client for the Fleet")
        wf_id = fleet_workflow_id(self._cluster)
        try:
            await signal_fleet_request(
                self._client, FleetInput(cluster=self._cluster, policy=self._policy), req, task_queue=self._task_queue
            )
        except RPCError as e:
            raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"signalling {wf_id}: {e.message}") from e
        return wf_id

    @activity.defn(name="fleet_confirm_decision")
    async def confirm_decision(self, request_id: str) -> IsolationDecision | None:
        """The Fleet's own record of its decision on ``request_id`` (None: it made none), read by query: what a
        JobRecovery acts on, whatever an ``isolation_decided`` signal said."""
        if self._client is None:
            raise ReboundError(FailureKind.CONFIGURATION, "this worker has no Temporal client for the Fleet")
        try:
            return await query_fleet_decision(self._client, self._cluster, request_id)
        except RPCError as e:
            if e.status is RPCStatusCode.NOT_FOUND:
                return None  # Temporal's definite word: no Fleet runs, so it decided nothing
            raise ReboundError(FailureKind.TEMPORAL_UNREACHABLE, f"querying the Fleet: {e.message}") from e

    @activity.defn(name="fleet_cluster_view")
    async def cluster_view(self) -> ClusterSnapshot:
        """A fresh read of every node and job: what Fleets started before ``fleet_view`` existed still call (their
        histories replay against it). Past about 3,000 jobs its answer is over Temporal's 2 MB payload limit."""
        with classified_errors():
            return await self._scheduler.snapshot()

    @activity.defn(name="fleet_view")
    async def view(self, inp: FleetViewInput) -> FleetView:
        """A fresh read of the cluster (the Fleet decides against it, never against a cached one), reduced here to
        what one decision needs (``workflows.domain.fleet_view``): only that enters the Fleet's history."""
        with classified_errors():
            return build_fleet_view(await self._scheduler.snapshot(), inp)

    @activity.defn(name="fleet_resume_node")
    @heartbeating_throughout
    async def resume_node(self, inp: ResumeNodeInput) -> ResumeNodeResult:
        """Resume a node Rebound drained; refuse (no error) when its reason is no longer exactly Rebound's."""
        with classified_errors():
            node = await self._scheduler.get_node(inp.node)
            if node is None:
                return ResumeNodeResult(node=inp.node, resumed=False, verified_at=_now(), detail="unknown node")
            if not node.is_drained:
                return ResumeNodeResult(node=inp.node, resumed=True, verified_at=_now(), detail="not drained")
            if node.reason != inp.expected_reason:
                return ResumeNodeResult(
                    node=inp.node, resumed=False, verified_at=_now(), detail=f"reason is now {node.reason!r}: not ours"
                )
            try:
                await self._scheduler.resume_node(inp.node, expected_reason=inp.expected_reason)
            except ReboundError as e:
                if e.kind is FailureKind.NOT_OWNED:
                    return ResumeNodeResult(node=inp.node, resumed=False, verified_at=_now(), detail=str(e))
                raise
            after = await self._scheduler.get_node(inp.node)
            if after is not None and after.is_drained:
                raise ReboundError(FailureKind.SCHEDULER_BUSY, f"resume of {inp.node} not visible yet")
        return ResumeNodeResult(node=inp.node, resumed=True, verified_at=_now(), detail="returned to service")


def _now() -> datetime:
    return datetime.now(UTC)
