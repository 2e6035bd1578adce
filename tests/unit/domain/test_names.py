"""The formats Rebound writes and reads back: drain reasons and isolation request ids."""

from __future__ import annotations

from workflows.domain.names import (
    drain_reason,
    incident_id,
    incident_number_of_request,
    is_rebound_drain,
    isolation_request_id,
    job_drain_prefix,
)


def test_drain_reason_names_the_incident_and_cause_and_is_recognised_as_ours() -> None:
    reason = drain_reason(incident_id(42, 1), "xid-79")
    assert reason == "rebound: 42-1 xid-79"
    assert is_rebound_drain(reason)
    assert reason.startswith(job_drain_prefix(42))
    assert not reason.startswith(job_drain_prefix(4))


def test_someone_elses_reason_is_not_ours() -> None:
    assert not is_rebound_drain("Not responding")
    assert not is_rebound_drain("maintenance: rebound: later")


def test_request_id_round_trips_to_the_incident_number() -> None:
    request = isolation_request_id("rebound/lab/job/42", 12)
    assert request == "rebound/lab/job/42/incident-12"
    assert incident_number_of_request(request) == 12
    assert incident_number_of_request("rebound/lab/job/42") is None
    assert incident_number_of_request("x/incident-abc") is None
