"""A job's owner steers Rebound through Slurm itself: the job's comment, which only the owner and Slurm's
administrators can change (Slurm authenticates them; nobody needs Temporal). Pure.

``scontrol update job=N comment='rebound: monitor=off'`` pauses Rebound for the job: nothing is done for it (no
drain, exclusion or restart asked for it) while its comment says so; ``monitor=on`` (or the key removed) resumes.
The comment is read again, fresh from the scheduler, before every action a JobRecovery would take. A comment that
opted in and no longer parses is read as a pause too: guessing what its owner meant could restart a job they
wanted left alone. A job opted in by an operator's selector (no ``rebound`` in its comment) is not paused by this.
"""

from __future__ import annotations

from workflows.domain.slurm import SlurmJob
from workflows.policy.optin import OptInError, parse_comment

__all__ = ["owner_pause"]


def owner_pause(job: SlurmJob) -> str | None:
    """Why the job's owner wants Rebound to leave it alone right now (its comment), or None."""
    try:
        spec = parse_comment(job.comment)
    except OptInError as e:
        return f"the job's comment no longer parses ({e}): not acting on a guess"
    if spec is not None and not spec.monitor:
        return "its owner paused Rebound (monitor=off in the job's comment)"
    return None
