"""Large scheduler documents are parsed in a child process: the same models and errors, the loop left free."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from activities.slurm.parse import load_payload, parse_jobs, parse_nodes, parse_submission
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.rest import SlurmRestScheduler
from tests.unit.slurm.golden import read as golden_bytes
from workers.bench.costs import generated_scheduler
from workers.bench.synthetic_slurm import sinfo_document, squeue_document
from workflows.domain.errors import FailureKind, ReboundError


@pytest.fixture
def offload() -> Iterator[ParseOffload]:
    parser = ParseOffload(min_bytes=0, processes=1, chunk=7)
    yield parser
    parser.close()


async def test_small_documents_stay_in_process() -> None:
    parser = ParseOffload()  # default threshold: 1 MB
    raw = golden_bytes("squeue.json")
    assert await parser.jobs(raw, source="squeue --json") == parse_jobs(load_payload(raw, source="s"))
    assert parser.offloaded == 0


async def test_a_child_parses_to_the_same_models(offload: ParseOffload) -> None:
    jobs_raw, nodes_raw = squeue_document(60), sinfo_document(50)
    jobs = await offload.jobs(jobs_raw, source="squeue --json")
    nodes = await offload.nodes(nodes_raw, source="sinfo --json")
    assert jobs == parse_jobs(load_payload(jobs_raw, source="s"))
    assert nodes == parse_nodes(load_payload(nodes_raw, source="s"))
    assert len(jobs) == 60 and len(nodes) == 50
    assert offload.offloaded == 2


async def test_the_parsers_errors_come_back_classified(offload: ParseOffload) -> None:
    with pytest.raises(ReboundError) as down:
        await offload.jobs(golden_bytes("squeue_ctld_down.json"), source="squeue --json")
    assert down.value.kind is FailureKind.SCHEDULER_UNREACHABLE
    with pytest.raises(ReboundError) as garbage:
        await offload.nodes(b"Segmentation fault", source="sinfo --json")
    assert garbage.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE
    assert "sinfo --json" in garbage.value.message


async def test_a_dead_child_costs_an_in_process_parse_never_the_read(offload: ParseOffload) -> None:
    pool = offload._ensure_pool()
    with pytest.raises(Exception):  # noqa: B017,PT011 - the pool breaks: BrokenProcessPool
        pool.submit(os._exit, 1).result()
    raw = squeue_document(20)
    assert await offload.jobs(raw, source="squeue --json") == parse_jobs(load_payload(raw, source="s"))
    assert offload.offloaded == 0
    assert await offload.jobs(raw, source="squeue --json")  # a new pool next time
    assert offload.offloaded == 1


async def test_a_child_finds_one_jobs_submission(offload: ParseOffload, tmp_path: Path) -> None:
    path = tmp_path / "squeue.json"
    path.write_bytes(squeue_document(30))
    found = await offload.submission_file(str(path), 1007, source="squeue --json")
    payload = load_payload(path.read_bytes(), source="s")
    jobs = payload["jobs"]
    assert isinstance(jobs, list)
    assert found == parse_submission(jobs[7], source="squeue --json")
    assert await offload.submission_file(str(path), 99, source="squeue --json") is None
    assert offload.offloaded == 2


def test_output_files_are_private_and_deleted(offload: ParseOffload) -> None:
    with offload.output_file() as f:
        path = Path(f.name)
        assert path.exists()
        assert path.parent.stat().st_mode & 0o077 == 0
    assert not path.exists()


async def test_the_cli_adapter_parses_a_large_listing_in_a_child(tmp_path: Path) -> None:
    """3,000 jobs: the CLI adapter hands both documents to a child and gets the same models back. How much of the
    event loop that frees is a benchmark's question (``python -m workers.bench.costs``), not a timed test's."""
    inline = generated_scheduler(3000, tmp_path / "inline", offload=False)
    children = ParseOffload()
    offloaded = generated_scheduler(3000, tmp_path / "offload", parser=children)
    try:
        got, expected = await offloaded.snapshot(), await inline.snapshot()
    finally:
        children.close()
    assert (got.jobs, got.nodes) == (expected.jobs, expected.nodes) and len(got.jobs) == 3000
    assert children.offloaded == 2  # squeue and sinfo, each parsed in a child


async def test_the_rest_adapter_parses_a_large_answer_in_a_child(offload: ParseOffload) -> None:
    documents = {"/slurm/v0.0.38/jobs": squeue_document(40, indent=None), "/slurm/v0.0.38/nodes": sinfo_document(30)}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=documents[request.url.path], headers={"content-type": "application/json"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://slurmrestd") as client:
        snapshot = await SlurmRestScheduler(client, parser=offload).snapshot()
    assert snapshot.jobs == parse_jobs(load_payload(documents["/slurm/v0.0.38/jobs"], source="s"))
    assert snapshot.nodes == parse_nodes(load_payload(documents["/slurm/v0.0.38/nodes"], source="s"))
    assert offload.offloaded == 2


def test_parse_children_die_with_the_worker(tmp_path: Path) -> None:
    """A worker SIGKILLed mid-run cannot shut its pool down: its parse children must not outlive it."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "worker.py"
    script.write_text(
        "import asyncio, os, sys\n"
        "from activities.slurm.parse_offload import ParseOffload\n"
        "from workers.bench.synthetic_slurm import squeue_document\n"
        "async def main():\n"
        "    offload = ParseOffload(min_bytes=0)\n"
        "    await offload.jobs(squeue_document(5), source='squeue --json')\n"
        "    pids = [p.pid for p in offload._ensure_pool()._processes.values()]\n"
        "    print(' '.join(map(str, pids)), flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    children = [int(p) for p in worker.stdout.readline().split()]
    assert children
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 20
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in children if Path(f"/proc/{pid}").exists() and _not_zombie(pid)]
    assert not alive, f"parse children outlived their worker: {alive}"


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
