"""The job's numeric user id (log files must belong to it), and output patterns a job owner can abuse."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from activities.slurm.parse import expand_output_path, load_payload, parse_job, parse_jobs
from activities.slurm.rest import SlurmRestScheduler
from tests.unit.slurm import golden
from workflows.domain.errors import FailureKind, ReboundError


def _jobs(raw: bytes, source: str = "squeue --json") -> dict[int, Any]:
    return {job.job_id: job for job in parse_jobs(load_payload(raw, source=source), source=source)}


def test_golden_captures_carry_the_uid() -> None:
    # The lab cluster ran every job as root: user_name "root", user_id 0 (not "unknown").
    for name in ("squeue.json", "squeue_requeue_completing.json", "rest_job_1.json"):
        raw = golden.load(name)
        jobs = _jobs(golden.read(name), source=name)
        assert jobs, name
        for item in raw["jobs"]:
            assert (jobs[item["job_id"]].user, jobs[item["job_id"]].user_id) == ("root", item["user_id"])
        assert {job.user_id for job in jobs.values()} == {0}, name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1000, 1000),
        (0, 0),
        ({"set": True, "infinite": False, "number": 1001}, 1001),  # v0.0.39+
        ({"set": False, "infinite": False, "number": 0}, None),
        (4294967294, None),  # NO_VAL
        (4294967295, None),  # INFINITE
        (-1, None),
    ],
)
def test_user_id_values(value: object, expected: int | None) -> None:
    jobs = _jobs(golden.squeue_with(job_1={"user_id": value}))
    assert jobs[1].user_id == expected
    assert jobs[2].user_id == 0  # the others untouched


def test_missing_user_id_is_unknown_not_root() -> None:
    item = dict(golden.load("rest_job_1.json")["jobs"][0])
    del item["user_id"]
    assert parse_job(item).user_id is None


def test_malformed_user_id_is_a_bad_response() -> None:
    with pytest.raises(ReboundError) as caught:
        _jobs(golden.squeue_with(job_1={"user_id": "1000"}))
    assert caught.value.kind is FailureKind.SCHEDULER_BAD_RESPONSE
    assert "user_id" in str(caught.value)


async def test_rest_adapter_reports_the_uid() -> None:
    payload = golden.load("rest_job_1.json")
    payload["jobs"][0]["user_id"] = 1234

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/job/1"):
            return httpx.Response(200, content=json.dumps(payload).encode())
        return httpx.Response(200, content=golden.read("squeue.json"))

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve), base_url="http://slurmrestd") as client:
        rest = SlurmRestScheduler(client)
        job = await rest.get_job(1)
        listed = {j.job_id: j for j in await rest.list_jobs()}
    assert job is not None and job.user_id == 1234
    assert listed[1].user_id == 0


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("/w/t-%99999999999999999999j.out", "/w/t-0000000042.out"),  # Slurm pads to 10 at most
        ("/w/t-%999999999j.out", "/w/t-0000000042.out"),  # was a 1 GB string, 6 s per job
        ("/w/t-%011j.out", "/w/t-0000000042.out"),
        ("/w/t-%" + "0" * 5000 + "5j.out", "/w/t-00042.out"),  # int() of 5000 digits raises
        ("/w/t-%3j.out", "/w/t-042.out"),
    ],
)
def test_output_pattern_padding_is_capped(pattern: str, expected: str) -> None:
    started = time.perf_counter()
    assert expand_output_path(pattern, job_id=42) == expected
    assert time.perf_counter() - started < 0.5


def test_one_abusive_output_pattern_does_not_break_the_whole_snapshot() -> None:
    # Before: OverflowError out of parse_jobs, so every job of the cluster went unseen.
    raw = golden.squeue_with(job_1={"standard_output": "/lab/jobs/train-%99999999999999999999j.out"})
    jobs = _jobs(raw)
    assert jobs[1].standard_output == "/lab/jobs/train-0000000001.out"
    assert set(jobs) == {1, 2, 3, 4, 5}
