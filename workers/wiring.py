"""Choosing adapters from settings: the only place that imports concrete scheduler backends."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from activities.slurm.cli import SlurmCliScheduler
from activities.slurm.parse_offload import ParseOffload
from activities.slurm.port import CompositeScheduler, SchedulerPort, SchedulerReads
from activities.slurm.rest_auth import TokenSource
from activities.slurm.snapshots import SnapshotCache
from workers.settings import GpuSettings, SchedulerBackend, Settings, SlurmSettings, WatchSettings, load_settings

log = logging.getLogger(__name__)


def build_scheduler(settings: SlurmSettings) -> SchedulerPort:
    """The scheduler port for these settings.

    ``rest`` reads through slurmrestd but acts through scontrol: Slurm 22.05's REST API cannot drain, resume,
    requeue or exclude (verified, shared/facts/slurm-lab.md section 5).
    """
    parser = ParseOffload(
        enabled=settings.parse_offload, min_bytes=settings.parse_offload_min_bytes, processes=settings.parse_processes
    )
    cli = SlurmCliScheduler(
        env=settings.command_env(), bin_dir=settings.bin_dir, timeout_s=settings.command_timeout_s, parser=parser
    )
    if settings.backend is SchedulerBackend.CLI:
        return cli
    if settings.backend is SchedulerBackend.REST:
        from activities.slurm.rest import SlurmRestScheduler, rest_client

        client = rest_client(
            url=settings.rest_url,
            unix_socket=settings.rest_socket,
            user=settings.rest_user,
            timeout_s=settings.command_timeout_s,
            token_source=_rest_token_source(settings, cli),
            ca_file=settings.rest_ca_file,
            client_cert=settings.rest_client_cert,
            client_key=settings.rest_client_key,
        )
        # scontrol ping (over munge, not the JWT) tells a refused token from a controller outage.
        reads = SlurmRestScheduler(
            client, api_version=settings.rest_api_version, parser=parser, controller_probe=cli.ping
        )
        return CompositeScheduler(reads=reads, actions=cli)
    from activities.slurm.pyslurm_adapter import PyslurmScheduler

    return PyslurmScheduler()


def _rest_token_source(settings: SlurmSettings, cli: SlurmCliScheduler) -> TokenSource | None:
    """The slurmrestd JWT's source: a file, ``scontrol token`` (renewed), a fixed token, or none (unix socket)."""
    from activities.slurm.rest_auth import ScontrolToken, StaticToken, TokenFile

    if settings.rest_socket is not None:
        return None  # local auth: the socket's peer uid, no token to expire
    if settings.rest_token_file is not None:
        return TokenFile(settings.rest_token_file)
    if settings.rest_token_lifespan_s is not None:

        async def scontrol(*args: str) -> tuple[int, str, str]:
            done = await cli.run("scontrol", *args)
            return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr

        return ScontrolToken(scontrol, settings.rest_user, settings.rest_token_lifespan_s)
    if settings.rest_token is not None:
        return StaticToken(settings.rest_token)
    return None


def build_snapshot_cache(scheduler: SchedulerReads, settings: WatchSettings) -> SnapshotCache:
    """The worker's one shared snapshot cache: build it once and hand the same object to every watcher.

    ClusterWatch's discovery and the per-job watchers all read through it, so the scheduler sees one
    ``snapshot()`` per ``snapshot_max_age_s`` for the whole worker, however many jobs are watched.
    """
    return SnapshotCache(scheduler, settings.snapshot_max_age_s)


def build_gpu_activities(settings: GpuSettings) -> list[Callable[..., Any]]:
    """The central worker's GPU activities (``dcgm_scrape_node``), ready for ``Worker(activities=...)``.

    Registered always, template or not: a call for a node without a configured template (and no explicit URL)
    then fails at once, non-retryably, naming the setting, instead of waiting on a task queue where no worker
    knows the activity until its timeout. Building it costs no connection; it reads the packaged XID catalogue,
    so a broken one stops the worker at start.
    """
    from activities.gpu.dcgm_activities import DcgmActivities, DcgmTargets

    def targets() -> DcgmTargets:
        # Which nodes have an exporter is live configuration (the settings file is re-read, like the operator
        # list): a broken file keeps the targets the worker started with, and says so.
        try:
            now = load_settings().gpu
        except Exception as exc:  # noqa: BLE001 - any invalid file: keep serving with the start-up settings
            log.warning("gpu settings not re-read (%s); using the start-up ones", exc)
            now = settings
        return DcgmTargets(now.dcgm_url_template, now.dcgm_nodes)

    acts = DcgmActivities(
        settings.dcgm_url_template,
        timeout_s=settings.dcgm_timeout_s,
        max_bytes=settings.dcgm_max_page_bytes,
        thresholds=settings.thresholds,
        targets=targets,
    )
    return [acts.scrape_node, acts.read_gpus]


def build_operator_verifier(settings: Settings) -> Callable[..., Any]:
    """The ``verify_operator_credential`` activity: ``unmunge`` through this host's munged, and the operator list
    read afresh at every verification (``fleet.operators`` from the TOML file applies without a restart; from the
    environment, at the worker's next start)."""
    from activities.auth.munge import MungeVerifier

    def operators() -> tuple[str, ...]:
        return load_settings().fleet.operators

    verifier = MungeVerifier(
        unmunge_bin=settings.auth.unmunge_bin,
        socket=settings.auth.munge_socket,
        timeout_s=settings.auth.timeout_s,
        operators=operators,
    )
    return verifier.verify
