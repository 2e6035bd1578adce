"""The one place JobRecovery's state changes: it holds the ``JobRecoveryState`` and records, never decides.

Ledger writes (through the pure ``ledger`` functions), timeline entries, the loop's state and its search
attribute, the Temporal UI's current details, the run's ending and its notifications. The workflow and its
steps (``steps``) call these after each activity or decision.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.job_recovery.ledger as ledger
    from workflows.constants import CAUSE, IMPLICATED_NODES, JOB_ID, RECOVERY_STATE, fleet_workflow_id
    from workflows.domain.fleet import IsolationDecision
    from workflows.domain.incident import Attribution, Incident
    from workflows.domain.notify import Notification, NotificationKind, Severity
    from workflows.domain.recovery import (
        JobRecoveryInput,
        JobRecoveryResult,
        JobRecoveryState,
        JobRecoveryStatus,
        RecoveryState,
    )
    from workflows.domain.slurm import SlurmJob
    from workflows.notify import job_notification, notify
    from workflows.policy.recovery import Ending

__all__ = ["Recorder"]


class Recorder:
    """One JobRecovery run's state, and the operations that record into it."""

    def __init__(self, inp: JobRecoveryInput) -> None:
        self.inp = inp
        self.state = inp.carried or JobRecoveryState(
            status=JobRecoveryStatus(
                cluster=inp.cluster,
                job_id=inp.job_id,
                state=RecoveryState.STARTING,
                restart_budget=inp.spec.restart_budget,
            )
        )
        if inp.carried is None:
            # What the operator's policy clamped of the comment's asks (``workflows.policy.optin_caps``): said once,
            # at the start, so the job's owner sees why the budget or window is not what the comment says. State
            # only: no command, so recorded histories replay unchanged.
            for note in inp.spec.capped:
                self.record("CAPPED", note)

    @property
    def status(self) -> JobRecoveryStatus:
        return self.state.status

    def incident(self, number: int) -> Incident:
        return ledger.incident(self.status, number)

    def update(self, **fields: Any) -> None:
        """Replace fields of the state (``progress``, ``last_job``...); the status goes through ``set_status``.

        A progress that tracks fewer ranks than the job's lines name (``workflows.domain.bounds``) is said in the
        timeline once, when it first does (no command: the timeline is state).
        """
        before = self.state.progress
        self.state = self.state.model_copy(update=fields)
        after = self.state.progress
        if after is not None and after.ranks_note and (before is None or not before.ranks_note):
            self.record("LIMIT", after.ranks_note)

    def set_status(self, status: JobRecoveryStatus) -> None:
        self.state = self.state.model_copy(update={"status": status})

    def update_status(self, **fields: Any) -> None:
        self.set_status(self.status.model_copy(update=fields))

    def observe(self, job: SlurmJob, *, keep_nodes: bool = False) -> None:
        self.set_status(ledger.observe_job(self.status, job, workflow.now(), keep_nodes=keep_nodes))

    def follow(self, job_id: int) -> None:
        """From now on this workflow watches ``job_id``, the resubmission of its job (one lineage, ADR 014).

        The input (carried across continue-as-new), the status and the ``ReboundJobId`` search attribute follow
        the new id; the lineage keeps every id, oldest first; the budget stays the logical job's.
        """
        lineage = self.status.lineage or (self.inp.job_id,)
        self.inp = self.inp.model_copy(update={"job_id": job_id})
        self.update_status(job_id=job_id, lineage=(*lineage, job_id), restart_count=0, nodes=())
        workflow.upsert_search_attributes([JOB_ID.value_set(str(job_id))])

    def record(self, event: str, detail: str, incident: int | None = None) -> None:
        self.set_status(ledger.record(self.status, workflow.now(), event, detail, incident))
        workflow.set_current_details(ledger.details_markdown(self.status))

    def record_decision(self, number: int, decision: IsolationDecision) -> None:
        """The Fleet's answer in incident ``number``: its drains as actions, its reasons in the timeline."""
        fleet_id = fleet_workflow_id(self.inp.cluster)
        self.set_status(ledger.record_decision(self.status, number, decision, fleet_id=fleet_id, now=workflow.now()))
        workflow.set_current_details(ledger.details_markdown(self.status))

    def set_state(self, state: RecoveryState, detail: str, incident: int | None = None) -> None:
        """The loop's state, in the status, the search attribute (one upsert) and the timeline."""
        self.update_status(state=state)
        workflow.upsert_search_attributes([RECOVERY_STATE.value_set(state.value)])
        self.record(state.value, detail, incident)

    def upsert_cause(self, attribution: Attribution) -> None:
        workflow.upsert_search_attributes(
            [CAUSE.value_set(attribution.cause), IMPLICATED_NODES.value_set(list(attribution.implicated_nodes))]
        )

    def end(self, ending: Ending, incident: int | None = None) -> JobRecoveryResult:
        """End the run; ``incident``: the open one, whose outcome the ending sets (when it names one)."""
        if incident is not None and ending.outcome:
            self.set_status(ledger.set_outcome(self.status, incident, ending.outcome))
        self.set_state(ending.state, ending.reason)
        if ending.state is RecoveryState.GAVE_UP:
            # Sent before the run returns, not awaited here: a webhook never delays the end (the workflow's run).
            note = self.notification(
                NotificationKind.GAVE_UP, f"Rebound gave up on job {self.inp.job_id}", ending.reason, Severity.CRITICAL
            )
            self.update(pending_notes=(*self.state.pending_notes, note))
        return JobRecoveryResult(job_id=self.inp.job_id, state=ending.state, reason=ending.reason)

    async def tell(self, kind: NotificationKind, title: str, text: str, severity: Severity, **fields: str) -> None:
        """A notification that never blocks or fails the recovery (``workflows.notify``)."""
        await notify(self.notification(kind, title, text, severity, **fields))

    def notification(
        self, kind: NotificationKind, title: str, text: str, severity: Severity, **fields: str
    ) -> Notification:
        return job_notification(
            kind, job_id=self.inp.job_id, cluster=self.inp.cluster, title=title, text=text, severity=severity, **fields
        )
