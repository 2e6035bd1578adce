"""A cluster action in flight outlives a slurmctld outage: its retries (``workflows/options.CLUSTER_ACTION``) carry
on for hours on the transient kinds, and stop at once on the permanent ones (``docs/benchmarks/chaos.md``)."""

from __future__ import annotations

from datetime import timedelta

from workflows.domain.errors import FailureKind
from workflows.options import CLUSTER_ACTION


def _attempts_within(outage: timedelta) -> int:
    """How many attempts the policy makes while slurmctld is down for ``outage`` (each failing fast)."""
    policy = CLUSTER_ACTION["retry_policy"]
    waited, interval, attempts = 0.0, policy.initial_interval.total_seconds(), 1
    cap = policy.maximum_interval.total_seconds()
    while waited + interval <= outage.total_seconds():
        waited += interval
        attempts += 1
        interval = min(interval * policy.backoff_coefficient, cap)
    return attempts


def test_a_drain_or_requeue_is_retried_through_an_hour_long_outage() -> None:
    policy = CLUSTER_ACTION["retry_policy"]
    hour = timedelta(hours=1)
    assert policy.maximum_attempts == 0 or policy.maximum_attempts >= _attempts_within(hour)
    assert CLUSTER_ACTION["schedule_to_close_timeout"] >= hour
    assert policy.maximum_interval <= timedelta(seconds=15)  # slurmctld back: acted on within seconds


def test_transient_kinds_are_retried_and_permanent_ones_are_not() -> None:
    refused = set(CLUSTER_ACTION["retry_policy"].non_retryable_error_types or ())
    for kind in (FailureKind.SCHEDULER_UNREACHABLE, FailureKind.SCHEDULER_BUSY):
        assert kind.value not in refused
    assert FailureKind.SCHEDULER_AUTH.value in refused
