"""Wiring opt-in discovery into the worker: the operator's policy file, the activities, the ClusterWatch start.

The policy file (``watch.policy_file``) opts jobs in without touching them. Each ``[[select]]`` table is one
``JobSelector``; the first that matches a job decides its spec, and the job's own ``rebound:`` comment still
wins key by key. Criteria left out match everything; a table without criteria selects every job::

    [[select]]
    partitions = ["gpu"]
    users = ["alice", "bob"]
    name_regex = "llm-.*"          # the whole job name must match

    [select.spec]                  # RecoverySpec fields; omitted ones keep their defaults
    checkpoint_dir = "/ckpt/shared"
    restart_budget = 3
    policy = "default"
    logs = ["/runs/logs/job-%j-rank-*.log"]
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle

from activities.slurm.snapshots import SnapshotCache
from activities.temporal import rebound_workflows
from activities.temporal.discovery import DiscoveryActivities, TemporalJobRecoveryStarter
from workers.settings import Settings
from workflows.domain.discovery import ClusterWatchInput
from workflows.domain.errors import FailureKind, ReboundError
from workflows.policy.optin import JobSelector

log = logging.getLogger("rebound.discovery")


def load_selectors(path: Path) -> list[JobSelector]:
    """The operator's selectors from a TOML policy file, in file order.

    Args:
        path: The file (see the module docstring for its format).

    Returns:
        One ``JobSelector`` per ``[[select]]`` table; empty when the file has none.

    Raises:
        ReboundError: ``CONFIGURATION`` when the file cannot be read, is not TOML, has keys other than
            ``select``, or a table that is not a valid selector (the message names the table and the field).
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise _config_error(path, f"cannot read it: {e.strerror or e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _config_error(path, f"not valid TOML: {e}") from e
    unknown = sorted(set(data) - {"select"})
    if unknown:
        raise _config_error(path, f"unknown top-level key(s) {', '.join(unknown)}; expected [[select]] tables")
    tables: Any = data.get("select", [])
    if not isinstance(tables, list):
        raise _config_error(path, "'select' must be an array of tables: write [[select]], not [select]")
    selectors = []
    for number, table in enumerate(tables, start=1):
        try:
            selectors.append(JobSelector.model_validate(table))
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'table'}: {err['msg']}" for err in e.errors()
            )
            raise _config_error(path, f"[[select]] #{number}: {problems}") from e
    return selectors


def build_discovery_activities(
    client: Client, snapshots: SnapshotCache, settings: Settings
) -> list[Callable[..., Any]]:
    """ClusterWatch's activities for this worker, ready for ``Worker(activities=...)``.

    Raises:
        ReboundError: ``CONFIGURATION`` for a bad ``watch.policy_file`` (the worker refuses to start: running
            without the operator's selectors would silently leave their jobs unmonitored).
    """
    policy_file = settings.watch.policy_file
    selectors = load_selectors(policy_file) if policy_file is not None else []
    if policy_file is not None:
        log.info("loaded %d job selector(s) from %s", len(selectors), policy_file)
    acts = DiscoveryActivities(
        snapshots,
        selectors,
        client,
        task_queue=settings.temporal.task_queue,
        poll_interval_s=settings.watch.poll_interval_s,
        detection=settings.detection,
        checkpoint_fallback=settings.checkpoints.fallback,
        caps=settings.optin,
        start=TemporalJobRecoveryStarter(
            client,
            task_queue=settings.temporal.task_queue,
            poll_interval_s=settings.watch.poll_interval_s,
            detection=settings.detection,
            checkpoint_fallback=settings.checkpoints.fallback,
            watch_hub=settings.watch.routing(),
        ),
    )
    return [acts.discover_jobs, acts.start_job_recovery]


async def start_cluster_watch(client: Client, settings: Settings) -> WorkflowHandle[Any, Any]:
    """Start the cluster's ClusterWatch workflow, or attach to the one already running (every worker calls this).

    A running ClusterWatch keeps its own input; a closed one (terminated by an operator, say) is started anew.
    """
    handle = await rebound_workflows.start_cluster_watch(
        client, ClusterWatchInput(cluster=settings.cluster_name), task_queue=settings.temporal.task_queue
    )
    log.info("ClusterWatch %s running (run %s)", handle.id, handle.result_run_id)
    return handle


def _config_error(path: Path, problem: str) -> ReboundError:
    return ReboundError(FailureKind.CONFIGURATION, f"policy file {path}: {problem}")
