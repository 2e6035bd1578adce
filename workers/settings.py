"""Rebound's configuration: one ``Settings`` object per process, built in ``workers/`` and passed down.

Sources, highest priority first: constructor arguments (tests), environment variables (``REBOUND_*``, nested
with ``__``, e.g. ``REBOUND_TEMPORAL__ADDRESS``), the TOML file named by ``REBOUND_CONFIG`` (if any), defaults.
Secrets are ``SecretStr``: they print as ``**********`` and are never logged.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from workflows.constants import DEFAULT_TASK_QUEUE
from workflows.domain.recovery import DetectionPolicy

CONFIG_FILE_ENV = "REBOUND_CONFIG"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TemporalSettings(_Section):
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
    query_timeout_s: float = Field(10.0, gt=0, description="Client-side limit on queries (they hang with no worker).")

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


class SlurmSettings(_Section):
    """The scheduler port's backend and its options."""

    backend: SchedulerBackend = Field(SchedulerBackend.CLI, description="cli, rest or pyslurm.")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for the Slurm commands (their default if unset).")
    bin_dir: Path | None = Field(None, description="Directory of squeue/sinfo/scontrol/sbatch (PATH if unset).")
    command_timeout_s: float = Field(15.0, gt=0, description="Limit for one Slurm command.")
    rest_url: str | None = Field(None, description="slurmrestd over TCP, e.g. http://127.0.0.1:6820 (JWT auth).")
    rest_socket: Path | None = Field(None, description="slurmrestd unix socket (local auth).")
    rest_user: str = Field("root", description="X-SLURM-USER-NAME for JWT auth.")
    rest_token: SecretStr | None = Field(None, description="X-SLURM-USER-TOKEN (a Slurm JWT).")
    rest_api_version: str = Field("v0.0.38", description="slurmrestd OpenAPI plugin version.")

    @model_validator(mode="after")
    def _rest_needs_endpoint(self) -> SlurmSettings:
        if self.backend is SchedulerBackend.REST and self.rest_url is None and self.rest_socket is None:
            raise ValueError("slurm.backend=rest needs slurm.rest_url or slurm.rest_socket")
        return self

    def command_env(self) -> dict[str, str]:
        """Environment for Slurm commands: ours plus SLURM_CONF when configured."""
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env


class NodeAgentSettings(_Section):
    """Settings of a node agent (one per Slurm node)."""

    node_name: str | None = Field(None, description="This node's Slurm name (SLURMD_NODENAME, never hostname).")
    py_spy_path: Path | None = Field(
        None, description="py-spy binary for hung ranks' stack dumps (unset: beside the agent's Python, then PATH)."
    )


class WatchSettings(_Section):
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
        description="Directories a job's log files must really lie under (symlinks resolved); patterns and files "
        'elsewhere are refused and reported. Empty: no root restriction. Env: a JSON list, ["/scratch"].',
    )
    log_require_owner: bool = Field(
        True,
        description="Read a job's log files only if its own user owns them (refused, and reported, otherwise); "
        "with no user id known for the job, none are read.",
    )

    @model_validator(mode="after")
    def _log_roots_absolute(self) -> WatchSettings:
        relative = [str(root) for root in self.log_roots if not root.is_absolute()]
        if relative:
            raise ValueError(f"watch.log_roots must be absolute paths: {', '.join(relative)}")
        return self


class GpuSettings(_Section):
    """Central GPU health reads: scraping each node's dcgm-exporter (docs/gpu-health.md)."""

    dcgm_url_template: str | None = Field(
        None,
        description="dcgm-exporter metrics URL of a node, {node} = its Slurm name, e.g. http://{node}:9400/metrics "
        "(unset: dcgm_scrape_node needs an explicit url).",
    )
    dcgm_timeout_s: float = Field(5.0, gt=0, le=120, description="Limit for one scrape, connect to last byte.")
    dcgm_max_page_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Largest exporter page accepted; a bigger one is an error, never cut short."
    )

    @model_validator(mode="after")
    def _template_names_node(self) -> GpuSettings:
        template = self.dcgm_url_template
        if template is not None and ("{node}" not in template or not template.startswith(("http://", "https://"))):
            raise ValueError("gpu.dcgm_url_template must be an http(s) URL containing {node}")
        return self


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
    detection: DetectionPolicy = Field(
        default_factory=DetectionPolicy, description="Hangs and stragglers: windows, thresholds, evidence."
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
