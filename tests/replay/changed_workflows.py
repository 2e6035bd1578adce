"""A deliberately changed JobRecovery, for the test that proves the replay gate catches a change of commands.

Registered under the real type name, it starts a timer before the real run: every committed JobRecovery history
then meets a ``StartTimer`` command where it recorded something else, which must fail the replay.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.constants import JOB_RECOVERY_WORKFLOW
    from workflows.domain.recovery import JobRecoveryInput, JobRecoveryResult
    from workflows.job_recovery import JobRecoveryWorkflow


@workflow.defn(name=JOB_RECOVERY_WORKFLOW)
class JobRecoveryWithAnExtraTimer(JobRecoveryWorkflow):
    """The real workflow, with one unpatched timer in front of it."""

    @workflow.run
    async def run(self, inp: JobRecoveryInput) -> JobRecoveryResult:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(inp)
