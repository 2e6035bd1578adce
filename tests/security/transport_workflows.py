"""The security suite's workflows, in a module of their own: the workflow sandbox re-imports the module that defines
a workflow, and the test modules import httpx and the lab."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

GATE_SIGNAL = "open_gate"


@activity.defn(name="security_echo")
async def echo(text: str) -> str:
    return text


@workflow.defn(name="SecurityEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(echo, text, start_to_close_timeout=timedelta(seconds=20))


@workflow.defn(name="SecurityGate")
class GateWorkflow:
    """Waits for one signal: the target of the forged signals (no worker needed: signals are recorded anyway)."""

    def __init__(self) -> None:
        self.opened = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.opened)

    @workflow.signal(name=GATE_SIGNAL)
    def open_gate(self) -> None:
        self.opened = True
