"""The slurmrestd adapter over ``httpx.MockTransport`` serving golden captures."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from activities.slurm.port import CompositeScheduler, SchedulerActions, SchedulerPort, SchedulerReads
from activities.slurm.rest import SlurmRestScheduler, rest_client
from activities.slurm.rest_auth import SlurmJwtAuth
from tests.fakes.scheduler import FakeScheduler
from tests.unit.slurm import golden
from tests.unit.slurm.jwt_support import jwt_hs256
from workflows.domain.errors import FailureKind, ReboundError

_V = "/slurm/v0.0.38"
_ROUTES: dict[str, tuple[int, bytes]] = {
    f"{_V}/jobs": (200, golden.read("squeue.json")),
    f"{_V}/nodes": (200, golden.read("sinfo.json")),
    f"{_V}/job/1": (200, golden.read("rest_job_1.json")),
    f"{_V}/job/9999": (500, golden.read("rest_job_unknown.json")),
    f"{_V}/node/n2": (200, golden.read("rest_node_n2.json")),
    f"{_V}/node/nope": (500, golden.read("rest_node_unknown.json")),
    f"{_V}/ping": (200, golden.read("rest_ping.json")),
}


class Server:
    """Answers from ``routes`` (404 text otherwise, as slurmrestd does) and records requested paths."""

    def __init__(self, routes: dict[str, tuple[int, bytes]] | None = None) -> None:
        self.routes = dict(_ROUTES if routes is None else routes)
        self.paths: list[str] = []
        self.raise_: Callable[[httpx.Request], None] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.raw_path.decode())  # as sent: percent-escapes kept
        if self.raise_ is not None:
            self.raise_(request)
        status, body = self.routes.get(request.url.path, (404, golden.read("rest_unknown_path_404.txt")))
        return httpx.Response(status, content=body)


@pytest.fixture
def server() -> Server:
    return Server()


@pytest_asyncio.fixture
async def rest(server: Server) -> AsyncIterator[SlurmRestScheduler]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(server), base_url="http://slurmrestd") as client:
        yield SlurmRestScheduler(client)


async def _kind_of(awaitable: object) -> FailureKind:
    with pytest.raises(ReboundError) as caught:
        await awaitable  # type: ignore[misc]  # any coroutine of the adapter
    return caught.value.kind


def test_reads_only(rest: SlurmRestScheduler) -> None:
    assert isinstance(rest, SchedulerReads)
    assert not isinstance(rest, SchedulerActions)  # 22.05's REST API cannot act


async def test_snapshot_is_two_requests(rest: SlurmRestScheduler, server: Server) -> None:
    snapshot = await rest.snapshot()
    assert sorted(server.paths) == [f"{_V}/jobs", f"{_V}/nodes"]
    assert [j.job_id for j in snapshot.jobs] == [1, 2, 3, 4, 5]
    assert snapshot.node("n4") is not None


async def test_get_job_and_node(rest: SlurmRestScheduler) -> None:
    job = await rest.get_job(1)
    assert job is not None and job.nodes == ("n1", "n2")
    assert await rest.get_job(9999) is None  # HTTP 500, error_number 2017
    node = await rest.get_node("n2")
    assert node is not None and node.is_drained
    assert await rest.get_node("nope") is None  # HTTP 500, errno 2018
    await rest.ping()


async def test_node_names_are_escaped(rest: SlurmRestScheduler, server: Server) -> None:
    assert await _kind_of(rest.get_node("a/b")) is FailureKind.CONFIGURATION  # 404: not a route
    assert server.paths == [f"{_V}/node/a%2Fb"]


@pytest.mark.parametrize(
    ("path", "status", "body", "kind"),
    [
        ("jobs", 500, golden.read("rest_ctld_down_jobs.json"), FailureKind.SCHEDULER_UNREACHABLE),
        ("jobs", 500, golden.read("rest_jwt_bad_token.json"), FailureKind.SCHEDULER_UNREACHABLE),
        ("jobs", 401, golden.read("rest_jwt_no_token_401.txt"), FailureKind.SCHEDULER_AUTH),
        ("jobs", 403, b"Forbidden", FailureKind.SCHEDULER_AUTH),
        ("jobs", 405, golden.read("rest_node_post_405.txt"), FailureKind.SCHEDULER_UNSUPPORTED),
        ("jobs", 502, b"<html>bad gateway</html>", FailureKind.SCHEDULER_UNREACHABLE),
        ("jobs", 500, b'{"errors": []}', FailureKind.SCHEDULER_UNREACHABLE),
        ("jobs", 200, b"{not json", FailureKind.SCHEDULER_BAD_RESPONSE),
        ("jobs", 304, b"", FailureKind.SCHEDULER_BAD_RESPONSE),
        ("nodes", 500, golden.read("rest_ctld_down_nodes.json"), FailureKind.SCHEDULER_UNREACHABLE),
        ("job/1", 500, golden.read("rest_ctld_down_job_1.json"), FailureKind.SCHEDULER_UNREACHABLE),
        ("ping", 500, golden.read("rest_ctld_down_ping.json"), FailureKind.SCHEDULER_UNREACHABLE),
    ],
)
async def test_http_failures(
    rest: SlurmRestScheduler, server: Server, path: str, status: int, body: bytes, kind: FailureKind
) -> None:
    server.routes[f"{_V}/{path}"] = (status, body)
    call = {"jobs": rest.list_jobs, "nodes": rest.list_nodes, "ping": rest.ping}.get(path)
    assert await _kind_of(call() if call else rest.get_job(1)) is kind


async def test_ping_without_an_up_controller(rest: SlurmRestScheduler, server: Server) -> None:
    server.routes[f"{_V}/ping"] = (200, b'{"errors": [], "pings": [{"ping": "DOWN"}]}')
    assert await _kind_of(rest.ping()) is FailureKind.SCHEDULER_UNREACHABLE


@pytest.mark.parametrize(
    ("exception", "kind"),
    [
        (httpx.ConnectError("refused"), FailureKind.SCHEDULER_UNREACHABLE),
        (httpx.ConnectTimeout("slow"), FailureKind.SCHEDULER_UNREACHABLE),
        (httpx.ReadTimeout("slow"), FailureKind.SCHEDULER_TIMEOUT),
        (httpx.RemoteProtocolError("eof"), FailureKind.SCHEDULER_UNREACHABLE),
        (httpx.UnsupportedProtocol("ftp"), FailureKind.CONFIGURATION),
    ],
)
async def test_transport_failures(
    rest: SlurmRestScheduler, server: Server, exception: Exception, kind: FailureKind
) -> None:
    def fail(request: httpx.Request) -> None:
        raise exception

    server.raise_ = fail
    assert await _kind_of(rest.snapshot()) is kind


async def test_unknown_api_version_is_configuration(server: Server) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(server), base_url="http://x") as client:
        kind = await _kind_of(SlurmRestScheduler(client, api_version="v0.0.40").list_jobs())
    assert kind is FailureKind.CONFIGURATION


async def test_rest_client_for_jwt() -> None:
    token = jwt_hs256({"exp": int(time.time()) + 3600, "iat": int(time.time()), "sun": "rebound"})
    client = rest_client(url="http://127.0.0.1:6820", user="rebound", token=SecretStr(token), timeout_s=3)
    async with client:
        assert client.base_url == httpx.URL("http://127.0.0.1:6820")
        assert isinstance(client.auth, SlurmJwtAuth)
        assert "X-SLURM-USER-TOKEN" not in client.headers  # set per request, from the (renewable) source
        assert client.timeout.read == 3
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=golden.read("rest_ping.json"))

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(answer), base_url="http://x", auth=client.auth
    ) as signed:
        await SlurmRestScheduler(signed).ping()
    assert seen[0].headers["X-SLURM-USER-NAME"] == "rebound"
    assert seen[0].headers["X-SLURM-USER-TOKEN"] == token


async def test_rest_client_prefers_the_socket() -> None:
    async with rest_client(url="http://127.0.0.1:6820", unix_socket="/run/slurmrestd.sock", token=SecretStr("t")) as c:
        assert "X-SLURM-USER-TOKEN" not in c.headers  # local auth: no token to leak or expire
        assert c.base_url == httpx.URL("http://slurmrestd")


def test_rest_client_misconfigurations() -> None:
    with pytest.raises(ReboundError) as caught:
        rest_client()
    assert caught.value.kind is FailureKind.CONFIGURATION
    with pytest.raises(ReboundError) as caught:
        rest_client(url="http://x", token=SecretStr(jwt_hs256({"exp": 2**31})))
    assert caught.value.kind is FailureKind.CONFIGURATION


async def test_composite_reads_rest_and_acts_elsewhere(rest: SlurmRestScheduler, server: Server) -> None:
    actions = FakeScheduler()
    composite = CompositeScheduler(reads=rest, actions=actions)
    assert isinstance(composite, SchedulerPort)
    assert [j.job_id for j in await composite.list_jobs()] == [1, 2, 3, 4, 5]
    assert (await composite.get_node("n2")) is not None
    await composite.drain_node("n1", "rebound: test")
    assert actions.nodes["n1"].is_drained
    assert [c.method for c in actions.calls] == ["drain_node"]
    assert server.paths == [f"{_V}/jobs", f"{_V}/node/n2"]
