"""The owner's pause in the job's comment (``workflows.policy.owner_steering``)."""

from __future__ import annotations

import pytest

from workflows.domain.slurm import JobState, SlurmJob
from workflows.policy.optin import OptInError, parse_comment
from workflows.policy.owner_steering import owner_pause


def job(comment: str) -> SlurmJob:
    return SlurmJob(job_id=1, name="train", state=JobState.RUNNING, comment=comment)


@pytest.mark.parametrize(
    ("comment", "paused"),
    [
        ("rebound: budget=3", None),
        ("rebound: budget=3;monitor=on", None),
        ("", None),  # opted in by an operator's selector: not the owner's pause
        ("team=nlp", None),
        ("rebound: budget=3;monitor=off", "monitor=off"),
        ("team=nlp | rebound: monitor=OFF", "monitor=off"),
        ("rebound: budget=O", "no longer parses"),  # a comment the owner broke: do less, not a guess
    ],
)
def test_the_owners_pause(comment: str, paused: str | None) -> None:
    why = owner_pause(job(comment))
    assert (why is None) if paused is None else (why is not None and paused in why), why


def test_monitor_takes_only_on_or_off() -> None:
    with pytest.raises(OptInError, match="monitor"):
        parse_comment("rebound: monitor=maybe")
    spec = parse_comment("rebound: monitor=off")
    assert spec is not None and spec.monitor is False
