"""Sections of ``Settings`` (``workers.settings``) that shape what Rebound reports and keeps, not how it watches:
webhook notifications, telemetry, audit reports, and what it does about jobs' checkpoints; and ``Section``, the
base of every section (unknown keys are errors, so a typo in a TOML file is never silently ignored)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from workflows.domain.bounds import DEFAULT_GLOB_ENTRIES, MAX_FILES, MAX_GLOB_ENTRIES
from workflows.domain.checkpoints import CheckpointFallback
from workflows.domain.notify import DEFAULT_KINDS, NotificationKind
from workflows.policy.gpu_thresholds import GpuHealthThresholds

__all__ = [
    "AuditSettings",
    "AuthSettings",
    "CheckpointSettings",
    "GpuSettings",
    "NotifySettings",
    "Section",
    "TelemetrySettings",
]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogReadSettings(Section):
    """Bounds on what reading one job's logs may cost, whatever patterns it names (``activities.logs``)."""

    glob_max_entries: int = Field(
        DEFAULT_GLOB_ENTRIES,
        ge=100,
        le=MAX_GLOB_ENTRIES,
        description="Directory entries one expansion of a job's log and heartbeat patterns may visit (each listing "
        "counts one more); a pattern that reaches it is refused, with the reason, until the job's next attempt "
        "(not walked again every few seconds).",
    )
    max_files: int = Field(
        MAX_FILES,
        ge=1,
        le=MAX_FILES,
        description="Files one job's patterns may match and be read; the others are refused, with the reason.",
    )


__all__ += ["LogReadSettings"]


_NOTIFICATION_KINDS = tuple(k.value for k in NotificationKind)


def _http_url(value: str | None, name: str) -> None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"{name} must be an http(s) URL")


class NotifySettings(Section):
    """Webhook notifications (Slack-compatible JSON; Mattermost, Teams and generic webhooks read its ``text``)."""

    webhook_url: SecretStr | None = Field(
        None, description="Incoming-webhook URL (a secret: Slack's carries its token). Unset: notifications off."
    )
    timeout_s: float = Field(5.0, gt=0, le=30, description="Limit for one webhook request, connect to last byte.")
    max_attempts: int = Field(
        3, ge=1, le=5, description="Requests per notification for 5xx, 429, timeouts and connection errors (4xx: 1)."
    )
    kinds: tuple[str, ...] = Field(
        tuple(k.value for k in DEFAULT_KINDS),
        description="Which kinds to send, of incident, approval_needed, gave_up, resumed, straggler, scheduler_auth. "
        'Env: a JSON list, ["incident","gave_up"].',
    )
    ui_base_url: str | None = Field(
        None, description="Temporal Web UI base URL, e.g. http://127.0.0.1:8233: notifications link the workflow."
    )

    @model_validator(mode="after")
    def _valid(self) -> NotifySettings:
        unknown = sorted(set(self.kinds) - set(_NOTIFICATION_KINDS))
        if unknown:
            raise ValueError(f"notify.kinds: unknown {', '.join(unknown)} (known: {', '.join(_NOTIFICATION_KINDS)})")
        _http_url(self.webhook_url.get_secret_value() if self.webhook_url else None, "notify.webhook_url")
        _http_url(self.ui_base_url, "notify.ui_base_url")
        return self


class TelemetrySettings(Section):
    """Metrics and traces: OTLP when an endpoint is set, else a Prometheus endpoint (docs/operations.md)."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector base URL, e.g. http://otel-collector:4318 (/v1/metrics and /v1/traces are "
        "appended). Set: metrics and traces go there and the Prometheus endpoint is off.",
    )
    prometheus_bind: str = Field(
        "127.0.0.1:9464",
        description="host:port of the /metrics endpoint when no OTLP endpoint is set; empty disables it. A process "
        "that finds the port taken (a second agent on one host) runs without it and logs a warning.",
    )
    service_name: str = Field("rebound", min_length=1, description="service.name of traces and metrics.")
    traces: bool = Field(True, description="Trace client -> workflow -> activities (exported only over OTLP).")

    @model_validator(mode="after")
    def _valid(self) -> TelemetrySettings:
        _http_url(self.otlp_endpoint, "telemetry.otlp_endpoint")
        if self.prometheus_bind and not _ip_port(self.prometheus_bind):
            raise ValueError(
                "telemetry.prometheus_bind must be an IP address and port (127.0.0.1:9464, 0.0.0.0:9464, "
                f"[::1]:9464; no host names) or empty, not {self.prometheus_bind!r}"
            )
        return self


def _ip_port(value: str) -> bool:
    """``ip:port`` (IPv6 in brackets), what Temporal's Prometheus server binds to."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class CheckpointSettings(Section):
    """Jobs' checkpoints before a restart (docs/checkpoints.md)."""

    fallback: CheckpointFallback = Field(
        CheckpointFallback.OFF,
        description="What to do about a partial newest checkpoint before a restart, for jobs that do not choose "
        "(ckpt_fallback= in their comment or a selector's spec wins): off (only report it) or quarantine (set it "
        "aside so the framework resumes from the previous complete one; rebound checkpoints restore DIR undoes it).",
    )


class AuditSettings(Section):
    """The scheduled Audit workflow and its reports (docs/operations.md, "Reading an audit report")."""

    enabled: bool = Field(
        True, description="Keep the cluster's audit Schedule at worker start (false: the worker deletes it)."
    )
    interval_s: float = Field(3600.0, ge=60, le=7 * 24 * 3600, description="Seconds between scheduled audits.")
    period_s: float | None = Field(
        None, gt=0, le=90 * 24 * 3600, description="Seconds each scheduled audit looks back (unset: interval_s)."
    )
    report_dir: Path | None = Field(None, description="Where reports are written (unset: state_dir/reports).")

    @property
    def effective_period_s(self) -> float:
        return self.period_s if self.period_s is not None else self.interval_s


class AuthSettings(Section):
    """How operators prove who they are: MUNGE, the cluster's own authentication (``docs/security.md``)."""

    munge_socket: Path = Field(
        Path("/run/munge/munge.socket.2"),
        description="munged's socket, on the CLI's host (to sign an action) and on the worker's (to verify it).",
    )
    munge_bin: str = Field("munge", description="The `munge` program (a name on PATH, or a path).")
    unmunge_bin: str = Field("unmunge", description="The `unmunge` program (a name on PATH, or a path).")
    timeout_s: float = Field(10.0, gt=0, le=60, description="Limit for one munge/unmunge run.")


class GpuSettings(Section):
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
    dcgm_nodes: tuple[str, ...] = Field(
        (),
        description="Nodes that run a dcgm-exporter (shell globs, e.g. gpu-*); empty: every node, once "
        "dcgm_url_template is set. Attribution and health checks read DCGM beside NVML on these nodes; read from "
        "the settings file at every read, so adding an exporter needs no restart.",
    )
    thresholds: GpuHealthThresholds = Field(
        default_factory=GpuHealthThresholds,
        description="The numbers behind the central GPU verdicts (DCGM reads): temperature, PCIe replay and NVLink "
        "error rates, retired pages, repeated XIDs, power/thermal violation share.",
    )

    @model_validator(mode="after")
    def _template_names_node(self) -> GpuSettings:
        template = self.dcgm_url_template
        if template is not None and ("{node}" not in template or not template.startswith(("http://", "https://"))):
            raise ValueError("gpu.dcgm_url_template must be an http(s) URL containing {node}")
        return self


class NodeCheckSettings(Section):
    """The node check job's program and output (ADR 018); its timeout, ranks and reservation are the Fleet's
    (``fleet.node_check``)."""

    command: tuple[str, ...] = Field(
        ("rebound-node-check",),
        min_length=1,
        description="The check program's argument list, run by srun once per rank on the node under check (a gloo "
        "all-reduce across the node's ranks, then dcgmi diag -r 1, nccl-tests all_reduce_perf and ibstat where "
        "installed); Rebound appends --timeout-s. Run without a shell.",
    )
    output_dir: Path | None = Field(
        None,
        description="Where check jobs write their output (check-<node>-<job>.out), read by the central worker: a "
        "directory both see (unset: <state_dir>/node-checks).",
    )


__all__ += ["NodeCheckSettings"]
