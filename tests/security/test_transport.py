"""Transport security on the lab: Rebound's processes reach Temporal only through the TLS proxy, with a client
certificate of the lab CA and the API key; everyone else is refused before the dev server sees a thing.

Each refusal is checked by a fresh observation through the dev server itself (the workflow's history, the task
queue's pollers), not by the refused call's exception alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    PollActivityTaskQueueRequest,
    PollWorkflowTaskQueueRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig
from temporalio.worker import Worker

from deploy.local.lab_pki import issue, make_ca, read_api_key
from deploy.local.tls_proxy import client_env, pki_paths
from tests.lab_support import REPO, LabHandle
from tests.security.transport_workflows import GATE_SIGNAL, EchoWorkflow, GateWorkflow, echo
from workers.client import certificate_reloader, connect
from workers.settings import TemporalSettings
from workflows.constants import DEFAULT_TASK_QUEUE, node_task_queue
from workflows.domain.errors import FailureKind, ReboundError

pytestmark = [pytest.mark.lab]


def tls_settings(
    lab: LabHandle,
    *,
    role: str | None = "worker",
    cert: Path | None = None,
    key: Path | None = None,
    server_ca: Path | None = None,
    api_key: str | None = "lab",
) -> TemporalSettings:
    """Settings through the proxy: ``role``'s certificate of the lab PKI unless ``cert``/``key`` are given."""
    pki = pki_paths(lab.cfg)
    if cert is None and role is not None:
        cert, key = pki.client_cert(role), pki.client_key(role)
    return TemporalSettings(
        address=lab.cfg.temporal_tls_address,
        namespace=lab.cfg.temporal_namespace,
        tls=True,
        tls_server_ca_path=server_ca or pki.ca_cert,
        tls_client_cert_path=cert,
        tls_client_key_path=key,
        api_key=read_api_key(pki) if api_key == "lab" else api_key,
        connect_timeout_s=15,
    )


async def direct(lab: LabHandle) -> Client:
    """The observer: the dev server itself, behind the proxy (what only the lab's own host reaches)."""
    return await connect(TemporalSettings(address=lab.cfg.temporal_address, namespace=lab.cfg.temporal_namespace))


async def event_kinds(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [event.WhichOneof("attributes") or "" for event in history.events]


async def activity_identities(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]


async def pollers(client: Client, queue: str) -> list[str]:
    identities: list[str] = []
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind)
        )
        identities += [p.identity for p in resp.pollers]
    return identities


def assert_unauthenticated(error: BaseException) -> None:
    """Refused by the proxy: an RPC status, or (a lazy client's first call connects) the connect's own error."""
    if isinstance(error, RPCError):
        assert error.status is RPCStatusCode.UNAUTHENTICATED, error
    else:
        assert "code: Unauthenticated" in str(error), error


async def run_echo(client: Client, queue: str, text: str, timeout_s: float = 30) -> str:
    workflow_id = f"security-echo-{uuid.uuid4().hex[:12]}"
    out = await client.execute_workflow(
        EchoWorkflow.run, text, id=workflow_id, task_queue=queue, execution_timeout=timedelta(seconds=timeout_s)
    )
    assert out == text
    return workflow_id


@pytest.mark.asyncio
async def test_a_worker_with_its_certificate_completes_a_workflow_through_the_proxy(security_lab: LabHandle) -> None:
    identity = f"rebound-worker-test-{uuid.uuid4().hex[:8]}"
    access_log = security_lab.layout.log_file("tls-proxy-access")
    seen = access_log.stat().st_size if access_log.exists() else 0
    client = await connect(tls_settings(security_lab), identity=identity)
    assert certificate_reloader(client) is not None  # TLS files: the client watches them
    queue = f"security-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=queue, workflows=[EchoWorkflow], activities=[echo]):
        workflow_id = await run_echo(client, queue, "through the proxy")
    observer = await direct(security_lab)
    assert await activity_identities(observer, workflow_id) == [identity]
    # The proxy saw the worker's certificate: this test's lines of its access log name the subject and the verdict.
    serial = subprocess.run(
        ["openssl", "x509", "-in", str(pki_paths(security_lab.cfg).client_cert("worker")), "-noout", "-serial"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with access_log.open() as f:
        f.seek(seen)
        lines = f.read().splitlines()
    polls = [line for line in lines if "PollActivityTaskQueue" in line]
    assert polls and all("CN=rebound-worker" in line and " SUCCESS " in line for line in polls)
    assert all(line.split("serial=")[1].split()[0] == serial.removeprefix("serial=") for line in polls)


ROGUES = {
    "no certificate": (None, None, "no client certificate"),
    "another CA": ("rogue", "rogue", "client certificate rejected by the TLS proxy (FAILED:unable to verify"),
    "expired": ("expired", "expired", "client certificate rejected by the TLS proxy (FAILED:certificate has expired)"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("rogue", list(ROGUES))
async def test_a_client_without_a_good_certificate_cannot_poll_or_signal(security_lab: LabHandle, rogue: str) -> None:
    pki = pki_paths(security_lab.cfg)
    cert_name, key_name, reason = ROGUES[rogue]
    observer = await direct(security_lab)
    queue = f"security-{uuid.uuid4().hex}"
    workflow_id = f"security-gate-{uuid.uuid4().hex[:12]}"
    await observer.start_workflow(
        GateWorkflow.run, id=workflow_id, task_queue=queue, execution_timeout=timedelta(minutes=2)
    )
    try:
        # Rebound's own connect reports the proxy's reason, as a configuration error.
        cert = pki.bad_cert(cert_name) if cert_name else None
        key = pki.bad_key(key_name) if key_name else None
        with pytest.raises(ReboundError) as refused:
            await connect(tls_settings(security_lab, role=None, cert=cert, key=key))
        assert refused.value.kind is FailureKind.TEMPORAL_AUTH
        assert reason in refused.value.message
        # A raw client (the API key too: only the certificate is wrong) polls the queue and forges the signal.
        rogue_client = await Client.connect(
            security_lab.cfg.temporal_tls_address,
            namespace=security_lab.cfg.temporal_namespace,
            api_key=read_api_key(pki),
            tls=TLSConfig(
                server_root_ca_cert=pki.ca_cert.read_bytes(),
                client_cert=cert.read_bytes() if cert else None,
                client_private_key=key.read_bytes() if key else None,
            ),
            identity=f"rogue-{rogue}",
            lazy=True,
        )
        with pytest.raises((RPCError, RuntimeError)) as poll:
            await rogue_client.workflow_service.poll_workflow_task_queue(
                PollWorkflowTaskQueueRequest(
                    namespace=security_lab.cfg.temporal_namespace,
                    task_queue=TaskQueue(name=queue),
                    identity=f"rogue-{rogue}",
                ),
                timeout=timedelta(seconds=10),
            )
        assert_unauthenticated(poll.value)
        # Rebound's own queues (the central worker's activities, a node agent's GPU reads): refused alike.
        for real_queue in (DEFAULT_TASK_QUEUE, node_task_queue(security_lab.nodes[0])):
            with pytest.raises((RPCError, RuntimeError)) as activity_poll:
                await rogue_client.workflow_service.poll_activity_task_queue(
                    PollActivityTaskQueueRequest(
                        namespace=security_lab.cfg.temporal_namespace,
                        task_queue=TaskQueue(name=real_queue),
                        identity=f"rogue-{rogue}",
                    ),
                    timeout=timedelta(seconds=10),
                )
            assert_unauthenticated(activity_poll.value)
            assert not any(p.startswith("rogue") for p in await pollers(observer, real_queue))
        with pytest.raises((RPCError, RuntimeError)) as signal:
            await rogue_client.get_workflow_handle(workflow_id).signal(GATE_SIGNAL)
        assert_unauthenticated(signal.value)
        # Fresh observations through the dev server: no signal in the history, no rogue among the pollers.
        assert "workflow_execution_signaled_event_attributes" not in await event_kinds(observer, workflow_id)
        assert not any(p.startswith("rogue") for p in await pollers(observer, queue))
        # The observation can see a signal: the lab's own worker certificate gets one in.
        good = await connect(tls_settings(security_lab))
        await good.get_workflow_handle(workflow_id).signal(GATE_SIGNAL)
        assert "workflow_execution_signaled_event_attributes" in await event_kinds(observer, workflow_id)
    finally:
        await observer.get_workflow_handle(workflow_id).terminate(reason="test over")


@pytest.mark.asyncio
async def test_the_api_key_reaches_the_proxy(security_lab: LabHandle) -> None:
    """A good certificate alone is not enough: the proxy checks ``authorization: Bearer`` too."""
    for api_key in (None, "not-the-key"):
        with pytest.raises(ReboundError) as refused:
            await connect(tls_settings(security_lab, api_key=api_key))
        assert refused.value.kind is FailureKind.TEMPORAL_AUTH
        assert "missing or wrong API key (authorization: Bearer)" in refused.value.message
    assert await connect(tls_settings(security_lab))  # the lab's key


def _worker_env(lab: LabHandle, **overrides: str) -> dict[str, str]:
    env = lab.lab.rebound.common_env()
    env.update(client_env(lab.cfg, "worker"))
    env.update(overrides)
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("expired client certificate", "client certificate rejected by the TLS proxy (FAILED:certificate has expired)"),
        ("wrong server CA", "its TLS certificate is signed by a CA that tls_server_ca_path does not hold"),
    ],
)
def test_the_worker_command_says_why_it_was_refused(security_lab: LabHandle, case: str, expected: str) -> None:
    pki = pki_paths(security_lab.cfg)
    if case.startswith("expired"):
        overrides = {
            "REBOUND_TEMPORAL__TLS_CLIENT_CERT_PATH": str(pki.bad_cert("expired")),
            "REBOUND_TEMPORAL__TLS_CLIENT_KEY_PATH": str(pki.bad_key("expired")),
        }
    else:
        overrides = {"REBOUND_TEMPORAL__TLS_SERVER_CA_PATH": str(pki.bad_cert("other-ca"))}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker"],
        env=_worker_env(security_lab, **overrides),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rebound: Temporal at ") and "REBOUND_TEMPORAL__" in last


def _replace(src: Path, dst: Path) -> None:
    """Write ``dst`` atomically (a rotation tool's way: a reader never sees half a file)."""
    tmp = dst.with_name(dst.name + ".new")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


@pytest.mark.asyncio
async def test_a_running_worker_follows_a_certificate_rotation(security_lab: LabHandle, tmp_path: Path) -> None:
    """Rotate the worker's certificate to a new CA's while it runs, then revoke the old CA at the proxy: the worker
    keeps completing activities, a worker that does not re-read its files stops, the old certificate is refused."""
    lab, proxy, pki = security_lab, security_lab.lab.proxy, pki_paths(security_lab.cfg)
    cert, key = tmp_path / "worker.pem", tmp_path / "worker.key"
    shutil.copyfile(pki.client_cert("worker"), cert)
    shutil.copyfile(pki.client_key("worker"), key)
    new_ca, new_ca_key = tmp_path / "ca2.pem", tmp_path / "ca2.key"
    make_ca(new_ca, new_ca_key, "Rebound lab CA, rotated")
    issue(tmp_path / "new.pem", tmp_path / "new.key", common_name="rebound-worker", ca_cert=new_ca, ca_key=new_ca_key)
    both = tmp_path / "both-cas.pem"
    both.write_bytes(pki.ca_cert.read_bytes() + new_ca.read_bytes())

    identity = f"rebound-worker-rotating-{uuid.uuid4().hex[:8]}"
    client = await connect(tls_settings(lab, cert=cert, key=key), identity=identity, cert_check_s=0.5)
    reloader = certificate_reloader(client)
    assert reloader is not None
    # A control worker on the old certificate that never re-reads its files.
    stale = await connect(tls_settings(lab), identity="rebound-worker-stale", cert_check_s=None)
    queue, stale_queue = f"security-{uuid.uuid4().hex}", f"security-{uuid.uuid4().hex}"
    worker = Worker(client, task_queue=queue, workflows=[EchoWorkflow], activities=[echo])
    stale_worker = Worker(
        stale,
        task_queue=stale_queue,
        workflows=[EchoWorkflow],
        activities=[echo],
        graceful_shutdown_timeout=timedelta(seconds=1),
    )
    tasks = [asyncio.create_task(worker.run()), asyncio.create_task(stale_worker.run())]
    observer = await direct(lab)
    stale_id = f"security-stale-{uuid.uuid4().hex[:12]}"
    try:
        await run_echo(client, queue, "before")
        await run_echo(client, stale_queue, "before")
        # 1. The proxy trusts both CAs; 2. the new certificate replaces the worker's files (key first);
        proxy.reload(client_ca=both)
        _replace(tmp_path / "new.key", key)
        _replace(tmp_path / "new.pem", cert)
        for _ in range(100):
            if reloader.reloads:
                break
            await asyncio.sleep(0.2)
        assert reloader.reloads == 1, reloader.last_error
        # 3. the old CA is revoked: only the new one is trusted; old connections end within 2 s.
        proxy.reload(client_ca=new_ca)
        await asyncio.sleep(4)
        after_id = await run_echo(client, queue, "after revocation")
        assert await activity_identities(observer, after_id) == [identity]
        # The old certificate is refused now, and the worker that kept it serves nothing.
        with pytest.raises(ReboundError) as refused:
            await connect(tls_settings(lab), cert_check_s=None)
        assert "client certificate rejected by the TLS proxy" in refused.value.message
        await observer.start_workflow(
            EchoWorkflow.run, "stale", id=stale_id, task_queue=stale_queue, execution_timeout=timedelta(minutes=1)
        )
        await asyncio.sleep(5)
        assert "workflow_task_started_event_attributes" not in await event_kinds(observer, stale_id)
        # (Not the queue's pollers: describe_task_queue lists pollers seen in the last minutes, the stale one too.)
        assert reloader.reloads == 1
    finally:
        proxy.reload()  # the lab CA again, for whatever runs next
        await asyncio.gather(worker.shutdown(), stale_worker.shutdown(), return_exceptions=True)
        await asyncio.wait(tasks, timeout=20)
        with contextlib.suppress(RPCError):  # it may not have started
            await observer.get_workflow_handle(stale_id).terminate(reason="test over")


def test_slurmrestd_behind_the_proxy(security_lab: LabHandle) -> None:
    """slurmrestd (no TLS of its own in 22.05) over https: a client certificate and a JWT get an answer; no
    certificate gets nginx's refusal, and nothing reaches slurmrestd."""
    pki = pki_paths(security_lab.cfg)
    url = f"{security_lab.cfg.slurmrestd_tls_url}/slurm/v0.0.38/ping"
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": security_lab.jwt_token()}
    tls = ssl.create_default_context(cafile=str(pki.ca_cert))
    tls.load_cert_chain(pki.client_cert("worker"), pki.client_key("worker"))
    with httpx.Client(verify=tls) as good:
        answer = good.get(url, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["pings"][0]["ping"] == "UP"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(pki.ca_cert))) as anonymous:
        refused = anonymous.get(url, headers=headers, timeout=10)
    assert refused.status_code == 400 and "No required SSL certificate was sent" in refused.text
