"""Rebound's configuration: one ``Settings`` object per process, built in ``workers/`` and passed down.

Sources, highest priority first: constructor arguments (tests), environment variables (``REBOUND_*``, nested
with ``__``, e.g. ``REBOUND_TEMPORAL__ADDRESS``), the TOML file named by ``REBOUND_CONFIG`` (if any), defaults.
Secrets are ``SecretStr``: they print as ``**********`` and are never logged.
"""

from __future__ import annotations

import ipaddress
import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from workers.settings_sections import (
    AuditSettings,
    AuthSettings,
    CheckpointSettings,
    GpuSettings,
    LogReadSettings,
    NodeCheckSettings,
    NotifySettings,
    Section,
    TelemetrySettings,
)
from workflows.constants import (
    DEFAULT_RESUME_TASK_QUEUE,
    DEFAULT_SHARD_QUEUE_PREFIX,
    DEFAULT_TASK_QUEUE,
    DEFAULT_WATCH_TASK_QUEUE,
)
from workflows.domain.fleet import FleetPolicy
from workflows.domain.optin_caps import OptInCaps
from workflows.domain.recovery import DetectionPolicy
from workflows.domain.watch_routing import DEFAULT_SHARDS, MAX_SHARDS, WatchRouting

__all__ = [
    "CONFIG_FILE_ENV",
    "AuditSettings",
    "AuthSettings",
    "CheckpointSettings",
    "GpuSettings",
    "NodeAgentSettings",
    "NotifySettings",
    "SchedulerBackend",
    "Settings",
    "SlurmSettings",
    "TelemetrySettings",
    "TemporalSettings",
    "WatchSettings",
    "load_settings",
]

CONFIG_FILE_ENV = "REBOUND_CONFIG"


class TemporalSettings(Section):
    """Where the Temporal frontend is and how to authenticate. Defaults match the lab's embedded dev server."""

    address: str = Field("127.0.0.1:7233", description="host:port of the Temporal frontend (gRPC).")
    namespace: str = Field("default", description="Temporal namespace Rebound's workflows live in.")
    task_queue: str = Field(DEFAULT_TASK_QUEUE, description="Task queue of the central Rebound worker.")
    tls: bool = Field(False, description="Use TLS (implied by an API key or client certificate).")
    tls_server_ca_path: Path | None = Field(
        None, description="PEM bundle to verify the server (system roots if unset)."
    )
    tls_client_cert_path: Path | None = Field(None, description="PEM client certificate for mTLS.")
    tls_client_key_path: Path | None = Field(None, description="PEM client private key for mTLS.")
    tls_server_name: str | None = Field(None, description="Override the TLS server name (SNI).")
    api_key: SecretStr | None = Field(None, description="API key (Temporal Cloud and compatible servers).")
    connect_timeout_s: float = Field(10.0, gt=0, description="Give up connecting after this many seconds.")
    tls_reload_s: float | None = Field(
        5.0,
        gt=0,
        description="A running worker or node agent re-reads its TLS files (server CA, client certificate and key) "
        "this often and moves to a new connection when they change (certificate rotation without a restart; "
        "docs/operations.md). None: never re-read.",
    )
    query_timeout_s: float = Field(10.0, gt=0, description="Client-side limit on queries (they hang with no worker).")
    max_concurrent_activities: int = Field(
        200,
        ge=1,
        le=10_000,
        description="Activity slots of the central worker's task queue: acting activities only (attribute, drain, "
        "requeue, notify, Fleet, checkpoints, lookups); watching and resume checks have their own queues and slots "
        "(watch.shard_slots, watch.resume_slots), so an action never waits behind a watch.",
    )
    max_concurrent_workflow_tasks: int = Field(
        16,
        ge=1,
        le=10_000,
        description="Workflow task slots of the central worker (all of Rebound's workflows). Workflow code is "
        "Python under one GIL: more slots add no throughput, they share the CPU so every task finishes later. With "
        "the SDK's 100, 1,000 starting jobs on a 2-core worker made tasks take over 10 s, time out, replay and time "
        "out again (ClusterWatch stuck at attempt 5, 499 of 1,000 jobs started in 10 min).",
    )
    max_cached_workflows: int = Field(
        10_000,
        ge=0,
        le=100_000,
        description="Workflows the central worker keeps in memory between tasks (the SDK's sticky cache; its own "
        "default is 1,000). Keep it above the monitored jobs plus ~40 (shards, feed, Fleet, ClusterWatch): past it "
        "every workflow task replays its whole history, and at 1,000 jobs the worker fell to 0.5 workflow tasks a "
        "second with 593 waiting (docs/benchmarks/scale.md). Costs roughly 0.3 MB of worker memory per workflow.",
    )

    @model_validator(mode="after")
    def _client_cert_pair(self) -> TemporalSettings:
        if (self.tls_client_cert_path is None) != (self.tls_client_key_path is None):
            raise ValueError("tls_client_cert_path and tls_client_key_path must be set together")
        return self

    @property
    def uses_tls(self) -> bool:
        """TLS is on when asked for, or implied by an API key or client certificate."""
        return self.tls or self.api_key is not None or self.tls_client_cert_path is not None


class SchedulerBackend(StrEnum):
    """How Rebound talks to Slurm."""

    CLI = "cli"
    """squeue/sinfo --json for reads, scontrol for actions (default; works on every Slurm with JSON output)."""
    REST = "rest"
    """slurmrestd for reads; actions through scontrol, because the 22.05 REST API has no drain/requeue."""
    PYSLURM = "pyslurm"
    """pyslurm (only for Slurm 25.11 clusters)."""


class SlurmSettings(Section):
    """The scheduler port's backend and its options."""

    backend: SchedulerBackend = Field(SchedulerBackend.CLI, description="cli, rest or pyslurm.")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the Slurm commands (their default if unset).")
    bin_dir: Path | None = Field(None, description="Directory of squeue/sinfo/scontrol/sbatch (PATH if unset).")
    command_timeout_s: float = Field(15.0, gt=0, description="Limit for one Slurm command.")
    rest_url: str | None = Field(
        None,
        description="slurmrestd over TCP with JWT auth: https://host:port through a TLS proxy (slurmrestd 22.05 "
        "has no TLS of its own); plain http only on loopback, e.g. http://127.0.0.1:6820.",
    )
    rest_socket: Path | None = Field(None, description="slurmrestd unix socket (local auth).")
    rest_user: str = Field("root", description="X-SLURM-USER-NAME for JWT auth.")
    rest_token: SecretStr | None = Field(
        None,
        description="X-SLURM-USER-TOKEN (a Slurm JWT). Cannot be renewed: past its exp it is not sent "
        "(SCHEDULER_AUTH); prefer rest_token_file or rest_token_lifespan_s.",
    )
    rest_token_file: Path | None = Field(
        None,
        description="A file holding the slurmrestd JWT (bare, or SLURM_JWT=... as scontrol token prints it), "
        "written by whatever renews it; read again whenever it changes.",
    )
    rest_token_lifespan_s: int | None = Field(
        None,
        ge=60,
        description="Make the JWT with `scontrol token username=<rest_user> lifespan=N` and renew it when a third "
        "of N is left (the worker's Unix user must be root or SlurmUser to ask for another user's token).",
    )
    rest_ca_file: Path | None = Field(
        None, description="CA bundle of the TLS proxy in front of slurmrestd (https:// rest_url; system CAs if unset)."
    )
    rest_client_cert: Path | None = Field(
        None, description="Client certificate (PEM) for a TLS proxy that verifies clients; with rest_client_key."
    )
    rest_client_key: Path | None = Field(None, description="Private key (PEM) of rest_client_cert.")
    rest_api_version: str = Field("v0.0.38", description="slurmrestd OpenAPI plugin version.")
    parse_offload: bool = Field(
        True,
        description="Parse large squeue/sinfo (or slurmrestd) documents in child processes, off the worker's event "
        "loop (10,000 jobs: ~40 MB, 1-2 s of parsing that otherwise stalls every heartbeat and poll).",
    )
    parse_offload_min_bytes: int = Field(
        1_000_000, ge=0, description="Documents shorter than this are parsed in-process (a child costs more)."
    )
    parse_processes: int = Field(
        2, ge=1, le=8, description="Child processes that parse (a snapshot has two documents)."
    )

    @model_validator(mode="after")
    def _rest_needs_endpoint(self) -> SlurmSettings:
        if self.backend is SchedulerBackend.REST and self.rest_url is None and self.rest_socket is None:
            raise ValueError("slurm.backend=rest needs slurm.rest_url or slurm.rest_socket")
        tokens = [self.rest_token, self.rest_token_file, self.rest_token_lifespan_s]
        if sum(t is not None for t in tokens) > 1:
            raise ValueError("set one of slurm.rest_token, rest_token_file, rest_token_lifespan_s")
        if (self.rest_client_cert is None) != (self.rest_client_key is None):
            raise ValueError("slurm.rest_client_cert and slurm.rest_client_key must be set together")
        rest = self.backend is SchedulerBackend.REST
        if rest and self.rest_socket is None and self.rest_url is not None and _plain_http_off_host(self.rest_url):
            raise ValueError(
                f"slurm.rest_url={self.rest_url}: a JWT over plain http leaves this host readable by anyone on the "
                "path; put slurmrestd behind a TLS proxy and use https:// (slurm.rest_ca_file), or a loopback URL"
            )
        tls = (self.rest_ca_file, self.rest_client_cert)
        if any(f is not None for f in tls) and not (self.rest_url or "").lower().startswith("https://"):
            raise ValueError("slurm.rest_ca_file/rest_client_cert need an https:// slurm.rest_url (a TLS proxy)")
        return self

    def command_env(self) -> dict[str, str]:
        """Environment for Slurm commands: ours plus SLURM_CONF when configured."""
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env


def _plain_http_off_host(url: str) -> bool:
    """An http:// URL whose host is not this one's loopback (where a token in clear reaches the network)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


class NodeAgentSettings(Section):
    """Settings of a node agent (one per Slurm node)."""

    node_name: str | None = Field(None, description="This node's Slurm name (SLURMD_NODENAME, never hostname).")
    slurm_cluster: str = Field(
        "",
        description="Slurm's ClusterName of this node's slurmd. Set it when slurmds of several clusters share a host "
        "(the lab): a job id names a job only within one cluster, so the rank scan then skips other clusters' "
        "processes. Empty: no cluster filter.",
    )
    py_spy_path: Path | None = Field(
        None, description="py-spy binary for hung ranks' stack dumps (unset: beside the agent's Python, then PATH)."
    )
    kernel_log: str = Field(
        "/dev/kmsg",
        description="The node's kernel log, followed for XIDs, NVSwitch SXids, PCIe AER, machine checks, InfiniBand, "
        "hung tasks, read-only file systems, NFS/Lustre (docs/node-events.md): /dev/kmsg (a character device, read "
        "record by record; needs CAP_SYSLOG where dmesg_restrict=1), or a file of kernel-style lines (the lab: "
        "{node} is replaced by the node's name). Empty: not read. The position (boot id and sequence number) is "
        "kept under state_dir/kernel-log/, so a restarted agent goes on where it stopped.",
    )
    kernel_log_poll_s: float = Field(
        0.2, gt=0, le=60, description="How often the kernel log is read for new records (a read costs a syscall)."
    )


class WatchSettings(Section):
    """Opt-in discovery (the ClusterWatch workflow) and the worker's shared scheduler snapshot."""

    poll_interval_s: float = Field(
        1.0, gt=0, le=300, description="How often ClusterWatch and the per-job watchers look at the shared snapshot."
    )
    snapshot_max_age_s: float = Field(
        1.0,
        ge=0,
        le=300,
        description="Reuse a scheduler snapshot younger than this: one squeue + one sinfo per interval per worker.",
    )
    policy_file: Path | None = Field(
        None, description="TOML file of operator selectors ([[select]] tables) that opt jobs in without a comment."
    )
    enabled: bool = Field(True, description="Start the cluster's ClusterWatch workflow when the worker starts.")
    log_roots: tuple[Path, ...] = Field(
        (),
        description="Directories a job's log files and its checkpoint directory (ckpt=) must really lie under "
        "(symlinks resolved); patterns, files and directories elsewhere are refused and reported. Required: a "
        "worker without it refuses to start (a job names the paths, the worker reads them as root). Env: a JSON "
        'list, ["/scratch"].',
    )
    log_require_owner: bool = Field(
        True,
        description="Read a job's log files, and scan or set aside its checkpoint directory, only if its own user "
        "owns them (refused, and reported, otherwise); with no user id known for the job, none are read.",
    )

    hub: bool = Field(
        True,
        description="Watch jobs through the shard hubs (ADR 015): S long-lived shard activities each poll many jobs. "
        "false: one long heartbeating job_watch activity per job, as before (about 100 jobs per worker).",
    )
    shards: int = Field(
        DEFAULT_SHARDS,
        ge=1,
        le=MAX_SHARDS,
        description="Watch shards per cluster (job -> shard = job id % shards). Every worker must use the same "
        "value; raise it, never lower it, while jobs are monitored (a running job's subscription names its shard).",
    )
    watch_task_queue: str = Field(
        DEFAULT_WATCH_TASK_QUEUE, min_length=1, description="Task queue of the shard activities (watch_shard)."
    )
    shard_queue_prefix: str = Field(
        DEFAULT_SHARD_QUEUE_PREFIX,
        min_length=1,
        description="Prefix of each shard's subscription task queue; the worker running shard k polls <prefix>k.",
    )
    resume_task_queue: str = Field(
        DEFAULT_RESUME_TASK_QUEUE, min_length=1, description="Task queue of the resume checks (job_wait_resume)."
    )
    shard_slots: int = Field(
        0,
        ge=0,
        le=MAX_SHARDS,
        description="Shard activities one worker may run at once; 0: all shards (one worker can hold every shard). "
        "At least 1; with several workers, shards spread as the workers poll.",
    )
    resume_slots: int = Field(200, ge=1, le=10_000, description="Resume checks one worker may run at once.")
    full_poll_every_s: float = Field(
        5.0,
        ge=0,
        le=60,
        description="A hub polls each job every poll_interval_s, but reads its new lines in full (decodes them, "
        "folds the step lines into its progress, judges hangs and stragglers) only this often, and at once when "
        "the job's files gained anything that may be a failure (any signature's text, non-ASCII, a replaced or "
        "truncated file), or its scheduler record changed; between, a quiet poll only reads and tests the new bytes "
        "(ADR 015, quiet polls). Progress verdicts (hang, straggler, stack samples) come up to this much later. 0: "
        "every poll is a full one.",
    )
    lease_s: float = Field(
        3600.0,
        ge=10,
        le=7 * 24 * 3600,
        description="A job renews its subscription this often (a safety net should a shard lose it); a hub forgets "
        "a job not renewed for twice this long.",
    )
    shard_heartbeat_timeout_s: float = Field(
        30.0,
        ge=5,
        le=600,
        description="A shard whose worker has not heartbeated for this long is taken over by another worker: the "
        "takeover time (plus ~1 s). The SDK heartbeats every 0.8 x this at most: 150 actions per shard-hour at 30.",
    )

    scheduler_feed: Literal["local", "shared"] = Field(
        "local",
        description="local: each worker's shard hubs poll the scheduler themselves (one squeue + sinfo per interval "
        "per worker). shared: one worker polls for the cluster and publishes each shard's changes through Temporal "
        "(the SchedulerFeed workflow; another worker takes over when it dies): one poll per interval per cluster, "
        "for ~150 actions per hour plus ~2 per change (ADR 015). Every worker must use the same value.",
    )
    feed_digest_s: float = Field(
        300.0,
        ge=5,
        le=86_400,
        description="With the shared feed: every shard gets a digest of its jobs and their nodes this often (and "
        "when the feed moves); a hub whose view missed an update reads the scheduler itself until then. "
        "2 actions per shard per digest.",
    )

    @model_validator(mode="after")
    def _log_roots_absolute(self) -> WatchSettings:
        relative = [str(root) for root in self.log_roots if not root.is_absolute()]
        if relative:
            raise ValueError(f"watch.log_roots must be absolute paths: {', '.join(relative)}")
        return self

    @property
    def effective_shard_slots(self) -> int:
        """All shards by default, plus the shared scheduler feed's activity (it runs on the same queue)."""
        return (self.shard_slots or self.shards) + (1 if self.scheduler_feed == "shared" else 0)

    def routing(self) -> WatchRouting | None:
        """What a JobRecovery's input carries to reach the hub; None when the hub is off (per-job watches)."""
        if not self.hub:
            return None
        return WatchRouting(
            shards=self.shards,
            shard_queue_prefix=self.shard_queue_prefix,
            lease_s=self.lease_s,
            resume_task_queue=self.resume_task_queue,
        )


class Settings(BaseSettings):
    """Everything one Rebound process needs. Build once with ``Settings()`` (or ``load_settings()``)."""

    model_config = SettingsConfigDict(
        env_prefix="REBOUND_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    cluster_name: str = Field("lab", description="Name of the cluster; part of every workflow id.")
    state_dir: Path = Field(Path("./.rebound-lab"), description="Where Rebound keeps local state and reports.")
    temporal: TemporalSettings = Field(default_factory=TemporalSettings, description="Temporal connection.")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="Scheduler backend.")
    node_agent: NodeAgentSettings = Field(default_factory=NodeAgentSettings, description="Node agent.")
    watch: WatchSettings = Field(
        default_factory=WatchSettings, description="Opt-in discovery (ClusterWatch) and the shared scheduler snapshot."
    )
    gpu: GpuSettings = Field(default_factory=GpuSettings, description="Central GPU health reads (DCGM exporter).")
    fleet: FleetPolicy = Field(
        default_factory=FleetPolicy,
        description="Node quarantine: mode (observe/canary/act), breaker, approvals, health checks, lemons.",
    )
    detection: DetectionPolicy = Field(
        default_factory=DetectionPolicy, description="Hangs and stragglers: windows, thresholds, evidence."
    )
    notify: NotifySettings = Field(default_factory=NotifySettings, description="Webhook notifications.")
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings, description="Metrics and traces.")
    audit: AuditSettings = Field(default_factory=AuditSettings, description="Scheduled audits and their reports.")
    checkpoints: CheckpointSettings = Field(
        default_factory=CheckpointSettings,
        description="Jobs' checkpoints before a restart (quarantine of partial ones).",
    )
    auth: AuthSettings = Field(
        default_factory=AuthSettings, description="Operators' authentication (MUNGE credentials on every action)."
    )
    optin: OptInCaps = Field(default_factory=OptInCaps, description="Ceilings on what a job's comment may ask.")
    logs: LogReadSettings = Field(default_factory=LogReadSettings, description="Bounds on reading a job's logs.")
    node_check: NodeCheckSettings = Field(
        default_factory=NodeCheckSettings, description="The node check job's program and output."
    )
    log_level: str = Field("INFO", description="Python logging level.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Constructor > environment > TOML file (``REBOUND_CONFIG``) > defaults; no .env magic."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            path = Path(config_file)
            if not path.is_file():
                raise FileNotFoundError(f"{CONFIG_FILE_ENV}={config_file}: no such file")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load_settings(**overrides: Any) -> Settings:
    """Build the process's settings; keyword overrides win over every other source."""
    return Settings(**overrides)
