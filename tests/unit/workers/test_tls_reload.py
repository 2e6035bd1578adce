"""CertificateReloader on the in-memory dev server: a change of the TLS files moves the client and its running
workers to a new connection, a failed reconnect keeps the working one (the TLS path itself: tests/security)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from workers.settings import TemporalSettings
from workers.tls_reload import CertificateReloader


@activity.defn(name="tls_reload_echo")
async def echo(text: str) -> str:
    return text


@workflow.defn(name="TlsReloadEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(echo, text, start_to_close_timeout=timedelta(seconds=10))


@pytest.mark.asyncio
async def test_a_rotation_moves_the_client_and_its_worker(temporal_env: WorkflowEnvironment, tmp_path: Path) -> None:
    target = temporal_env.client.service_client.config.target_host
    ca = tmp_path / "ca.pem"
    ca.write_text("first")
    settings = TemporalSettings(address=target, tls_server_ca_path=ca)
    fail = {"now": True}

    async def reconnect() -> Client:
        if fail["now"]:
            raise RuntimeError("new files not trusted yet")
        return await Client.connect(target, data_converter=pydantic_data_converter)

    reloader = CertificateReloader(settings, reconnect, interval_s=3600)
    client = await Client.connect(target, data_converter=pydantic_data_converter, plugins=[reloader])
    reloader.attach(client)
    queue = f"tq-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=queue, workflows=[EchoWorkflow], activities=[echo]) as worker:
        first_service = client.service_client
        assert await reloader.check_once() is False  # nothing changed
        ca.write_text("second")
        assert await reloader.check_once() is False  # the new files do not connect: keep the old connection
        assert reloader.last_error == "new files not trusted yet" and client.service_client is first_service
        fail["now"] = False
        assert await reloader.check_once() is True
        assert reloader.reloads == 1 and reloader.last_error is None
        assert client.service_client is not first_service
        assert worker.client.service_client is client.service_client
        # The worker polls on the new connection: a workflow and its activity complete.
        out = await client.execute_workflow(
            EchoWorkflow.run, "after", id=f"wf-{uuid.uuid4().hex}", task_queue=queue, run_timeout=timedelta(seconds=30)
        )
        assert out == "after"
        assert await reloader.check_once() is False  # the same files again: no second reconnect
