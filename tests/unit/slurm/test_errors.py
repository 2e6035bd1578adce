"""Classification of Slurm's error texts and numbers, on the outputs captured from a real 22.05 cluster."""

from __future__ import annotations

import pytest

from activities.slurm.errors import (
    _TEXTS,
    ApiError,
    SlurmErrno,
    api_errors,
    classify_api_errors,
    default_kind,
    errno_from_text,
    kind_from_text,
)
from tests.unit.slurm import golden
from workflows.domain.errors import FailureKind

_CASES = golden.scontrol_errors()


@pytest.mark.parametrize(
    ("case", "errno", "kind"),
    [
        ("running_job_excnodelist", SlurmErrno.JOB_NOT_PENDING, FailureKind.SCHEDULER_BUSY),
        ("running_job_starttime_now", SlurmErrno.JOB_NOT_PENDING, FailureKind.SCHEDULER_BUSY),
        ("unknown_job_requeue", SlurmErrno.INVALID_JOB_ID, FailureKind.JOB_NOT_FOUND),
        ("unknown_job_excnodelist", SlurmErrno.INVALID_JOB_ID, FailureKind.JOB_NOT_FOUND),
        ("unknown_node_drain", SlurmErrno.INVALID_NODE_NAME, FailureKind.NODE_NOT_FOUND),
        ("unknown_node_resume", SlurmErrno.INVALID_NODE_NAME, FailureKind.NODE_NOT_FOUND),
        ("drain_without_reason", None, FailureKind.SCHEDULER_REJECTED),
        ("resume_not_drained_node", SlurmErrno.INVALID_NODE_STATE, FailureKind.SCHEDULER_REJECTED),
        ("pending_job_requeue", SlurmErrno.JOB_PENDING, FailureKind.SCHEDULER_REJECTED),
        ("no_requeue_job_requeue", SlurmErrno.DISABLED, FailureKind.SCHEDULER_REJECTED),
        ("excnodelist_unknown_node", SlurmErrno.INVALID_NODE_NAME, FailureKind.NODE_NOT_FOUND),
        ("ctld_down_requeue", SlurmErrno.UNEXPECTED_MSG, FailureKind.SCHEDULER_UNREACHABLE),
        ("ctld_down_excnodelist", SlurmErrno.UNEXPECTED_MSG, FailureKind.SCHEDULER_UNREACHABLE),
        ("ctld_down_drain", None, FailureKind.SCHEDULER_UNREACHABLE),
    ],
)
def test_real_scontrol_errors(case: str, errno: SlurmErrno | None, kind: FailureKind) -> None:
    captured = _CASES[case]
    assert captured["rc"] == 1
    assert errno_from_text(captured["stderr"]) == errno
    assert kind_from_text(captured["stderr"]) is kind


def test_ping_outputs() -> None:
    assert _CASES["ping_up"]["rc"] == 0
    assert kind_from_text(_CASES["ctld_down_ping"]["stdout"]) is FailureKind.SCHEDULER_UNREACHABLE


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("squeue: fatal: Unable to process configuration file", FailureKind.CONFIGURATION),
        ("error: s_p_parse_file: cannot stat file /x/slurm.conf", FailureKind.CONFIGURATION),
        ("slurm_load_jobs error: Socket timed out on send/recv operation", FailureKind.SCHEDULER_TIMEOUT),
        ("slurm_load_jobs error: Protocol authentication error", FailureKind.SCHEDULER_AUTH),
        ("scontrol: error: Invalid user id", FailureKind.SCHEDULER_AUTH),
        (
            'squeue: error: Munge encode failed: Failed to access "/run/munge/munge.socket.2": No such file',
            FailureKind.SCHEDULER_AUTH,
        ),
        ("error: Munge decode failed: Expired credential", FailureKind.SCHEDULER_AUTH),
        ("error: Munge decode failed: Invalid credential", FailureKind.SCHEDULER_AUTH),
        ("slurm_load_node error: Invalid authentication credential", FailureKind.SCHEDULER_AUTH),
        ("Invalid user for SlurmUser slurm, ignored", FailureKind.CONFIGURATION),  # slurm.conf, not a credential
        ("Access/permission denied for job 3", FailureKind.CONFIGURATION),
        ("Job can not be altered now, try again later for job 3", FailureKind.SCHEDULER_BUSY),
        (
            "Job has already finished for job 3\nslurm_suspend error: Job has already finished",
            FailureKind.SCHEDULER_REJECTED,
        ),
        ("connect: Connection refused", FailureKind.SCHEDULER_UNREACHABLE),
        ("something new", FailureKind.SCHEDULER_REJECTED),  # unknown = permanent (ADR-056)
    ],
)
def test_kind_from_text(text: str, kind: FailureKind) -> None:
    assert kind_from_text(text) is kind


def test_default_kind_of_unknown_numbers_is_permanent() -> None:
    assert default_kind(-1) is FailureKind.SCHEDULER_REJECTED
    assert default_kind(123456) is FailureKind.SCHEDULER_REJECTED
    assert default_kind(SlurmErrno.COMMUNICATIONS_CONNECTION) is FailureKind.SCHEDULER_UNREACHABLE


def test_api_errors_accept_both_spellings() -> None:
    errors = api_errors(golden.load("rest_job_unknown.json"), source="rest")
    assert errors == (ApiError(2017, "Invalid job id specified", "Unable to find JobId=9999", "slurm_load_job"),)
    assert api_errors(golden.load("rest_node_unknown.json"), source="rest")[0].number == 2018  # "errno"
    assert api_errors({"errors": [{"error": "x", "errno": True}]}, source="x")[0].number == -1
    assert api_errors({}, source="x") == ()


def test_auth_numbers_in_json_errors_are_their_own_kind() -> None:
    # slurmrestd or squeue --json may carry the auth plugin's numbers: never an outage, never a job's state.
    for number in (1007, 2010, 6000, 6001, 6002, 6006, 6007, 6008):
        errors = [ApiError(number, "auth")]
        assert classify_api_errors(errors, source="x").kind is FailureKind.SCHEDULER_AUTH, number
        assert not FailureKind.SCHEDULER_AUTH.retryable


def test_strerror_texts_never_contain_one_another() -> None:
    # errno_from_text takes the first match: the table is only sound if no text contains another.
    texts = list(_TEXTS)
    assert not [(a, b) for a in texts for b in texts if a != b and a in b]


def test_classify_mixed_numbers_uses_the_specific_one() -> None:
    errors = [ApiError(-1, "Unspecified error"), ApiError(2002, "Access/permission denied")]
    assert classify_api_errors(errors, source="x").kind is FailureKind.CONFIGURATION
