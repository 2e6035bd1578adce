"""JobRecovery, the durable recovery loop of one monitored job: its public surface is the workflow class.

Inside: ``workflow`` (orchestration only), ``ledger`` and ``state`` (pure state changes), ``scheduler``,
``evidence`` and ``fleet_exchange`` (the activities it starts). Its decisions are in ``workflows.policy.recovery``
and ``workflows.policy.budget``; its state model is ``workflows.domain.recovery.JobRecoveryState``.
"""

from workflows.job_recovery.workflow import JobRecoveryWorkflow

__all__ = ["JobRecoveryWorkflow"]
