"""Formats that workflows, activities, policy and the lab must read and write alike. Pure (stdlib only).

* The drain reason: every node Rebound drains carries ``rebound: <job>-<n> <cause>`` in Slurm. The prefix is the
  mark of ownership: only a drain that starts with it is ever resumed, and only while the node still carries
  exactly the reason Rebound set.
* The incident id ``<job>-<n>``: the ``n``-th incident of a job, as people and the drain reason show it.
* The isolation request id ``<JobRecovery workflow id>/incident-<n>``: a JobRecovery asks the Fleet once per
  incident, and a repeated request (a retried activity, a replayed workflow) gets the same decision.

``workflows.constants`` re-exports these with the other shared names; domain and policy code imports them here
(domain imports only domain).
"""

from __future__ import annotations

__all__ = [
    "DRAIN_REASON_PREFIX",
    "drain_reason",
    "incident_id",
    "incident_number_of_request",
    "is_rebound_drain",
    "isolation_request_id",
    "job_drain_prefix",
]

#: Every drain reason Rebound sets starts with this: the mark of ownership.
DRAIN_REASON_PREFIX = "rebound:"

_REQUEST_INCIDENT = "/incident-"


def incident_id(job_id: int | str, number: int) -> str:
    """The ``number``-th incident of job ``job_id``: ``"42-1"``."""
    return f"{job_id}-{number}"


def drain_reason(incident: str, cause: str) -> str:
    """The Slurm reason of a drain Rebound does for ``incident`` (an ``incident_id``): ``rebound: 42-1 xid-79``."""
    return f"{DRAIN_REASON_PREFIX} {incident} {cause}"


def is_rebound_drain(reason: str) -> bool:
    """The node's Slurm reason is one Rebound set (a drain by anyone else is never touched)."""
    return reason.startswith(DRAIN_REASON_PREFIX)


def job_drain_prefix(job_id: int | str) -> str:
    """What every drain reason for one of job ``job_id``'s incidents starts with: ``rebound: 42-``."""
    return f"{DRAIN_REASON_PREFIX} {job_id}-"  # drain_reason(incident_id(job_id, n), cause) up to the n


def isolation_request_id(workflow_id: str, number: int) -> str:
    """The Fleet request of a JobRecovery's ``number``-th incident: ``rebound/lab/job/42/incident-1``."""
    return f"{workflow_id}{_REQUEST_INCIDENT}{number}"


def incident_number_of_request(request_id: str) -> int | None:
    """The incident number an ``isolation_request_id`` was made for; None for an id of another shape."""
    _, sep, number = request_id.rpartition(_REQUEST_INCIDENT)
    return int(number) if sep and number.isdigit() else None
