"""The numbers behind the GPU health rules, and the one constructor every rule states its finding with. Pure."""

from __future__ import annotations

from pydantic import Field

from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuAction, GpuEvent, GpuHealthFinding, GpuHealthStatus

__all__ = ["DEFAULT_THRESHOLDS", "GpuHealthThresholds", "gpu_finding"]


class GpuHealthThresholds(Frozen):
    """The numbers behind the rules; defaults are DCGM's own limits where DCGM has one."""

    temperature_watch_c: int = Field(85, gt=0)
    """Watch a GPU at or above this temperature (the default exporter page has no throttle reasons)."""
    pcie_replays_per_min: float = Field(8.0, ge=0)
    """DCGM_LIMIT_MAX_PCIREPLAY_RATE: "8 replays per minute is the maximum recommended by RM"."""
    nvlink_crc_per_s: float = Field(100.0, ge=0)
    """DCGM: "CRC errors only matter at rates of 100+ per second"."""
    retired_pages_drain: int = Field(63, gt=0)
    """DCGM_LIMIT_MAX_RETIRED_PAGES: SBE plus DBE retired pages at which the GPU is due for RMA."""
    xid_repeats_drain: int = Field(3, ge=2)
    """An application-class XID seen this often on one GPU (within the events given) drains the node."""
    assumed_interval_s: float = Field(60.0, gt=0)
    """Seconds between two samples that carry no ``observed_at``."""
    nvlink_replay_per_s: float = Field(1.0, ge=0)
    """DCGM: NVLink retransmissions per second (between two scrapes) worth watching; Rebound's choice, DCGM has
    no published limit. Any growth of NVLink *recoveries* (a link went down) is watched whatever this says."""
    violation_share_watch: float = Field(0.5, gt=0, le=1)
    """DCGM: share of the time between two scrapes a GPU was held back by its power limit or by temperature
    (``DCGM_FI_DEV_POWER_VIOLATION``/``THERMAL_VIOLATION``) at which it is watched."""


DEFAULT_THRESHOLDS = GpuHealthThresholds()


def gpu_finding(
    rule: str,
    status: GpuHealthStatus,
    action: GpuAction,
    reason: str,
    *,
    field: str = "",
    value: object = "",
    previous: object = "",
    xid: int | None = None,
    event: GpuEvent | None = None,
) -> GpuHealthFinding:
    """A rule's finding; ``value`` and ``previous`` are kept as text (a bool, a count, a hex mask)."""
    return GpuHealthFinding(
        rule=rule,
        status=status,
        action=action,
        reason=reason,
        field=field,
        value=str(value),
        previous=str(previous),
        xid=xid,
        event=event,
    )
