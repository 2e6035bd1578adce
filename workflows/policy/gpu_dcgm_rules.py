"""GPU health rules over the fields only DCGM exports: NVLink retransmissions and recoveries, the time a GPU was
held back by its power limit or by temperature, and the exporter's last-XID gauge. Pure; ``gpu_health`` applies
them beside ``gpu_sample_rules`` (NVML samples leave these fields None, so they never fire there).

The counters need a baseline (the previous scrape): a snapshot says how much since DCGM started, not whether it
is happening now. The last-XID gauge holds the LAST XID ever raised, with no time: without a previous scrape it
is reported as evidence (healthy, named) and never as a fault; the scrape-to-scrape diff
(``activities.gpu.dcgm.diff_scrapes``) turns a change into an XID event.
"""

from __future__ import annotations

from workflows.domain.gpu import GpuAction, GpuHealthFinding, GpuHealthStatus, GpuSample
from workflows.policy.gpu_thresholds import GpuHealthThresholds, gpu_finding

__all__ = ["dcgm_sample_findings"]

_US = 1_000_000


def dcgm_sample_findings(s: GpuSample, prev: GpuSample | None, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    """What the DCGM-only fields of one GPU's sample say, against the previous scrape (None: first scrape)."""
    out: list[GpuHealthFinding] = []
    if prev is None:
        if s.last_xid:
            out.append(
                gpu_finding(
                    "dcgm_last_xid",
                    GpuHealthStatus.HEALTHY,
                    GpuAction.NONE,
                    f"DCGM's last-XID gauge reads {s.last_xid}: when it happened is unknown without an earlier "
                    "scrape (an old fault is kept there); NVML's events date it",
                    field="last_xid",
                    value=s.last_xid,
                )
            )
        return out
    seconds = _interval_s(s, prev, t)
    recoveries = _growth(s.nvlink_recovery_errors, prev.nvlink_recovery_errors)
    if recoveries:
        out.append(
            _watch(
                "nvlink_recovery_growth",
                f"nvlink_recovery_errors grew {prev.nvlink_recovery_errors} -> {s.nvlink_recovery_errors}: "
                "an NVLink went down and recovered",
                "nvlink_recovery_errors",
                s.nvlink_recovery_errors,
                prev.nvlink_recovery_errors,
            )
        )
    replays = _growth(s.nvlink_replay_errors, prev.nvlink_replay_errors)
    if replays and replays / seconds >= t.nvlink_replay_per_s:
        out.append(
            _watch(
                "nvlink_replay_growth",
                f"nvlink_replay_errors grew {prev.nvlink_replay_errors} -> {s.nvlink_replay_errors} "
                f"({replays / seconds:.1f}/s over {seconds:.0f} s, limit {t.nvlink_replay_per_s:g}/s): "
                "NVLink retransmissions",
                "nvlink_replay_errors",
                s.nvlink_replay_errors,
                prev.nvlink_replay_errors,
            )
        )
    for field, rule, what in (
        ("power_violation_us", "power_violation", "its power limit"),
        ("thermal_violation_us", "thermal_violation", "temperature"),
    ):
        now, before = getattr(s, field), getattr(prev, field)
        held = _growth(now, before) / _US
        if held and held / seconds >= t.violation_share_watch:
            out.append(
                _watch(
                    rule,
                    f"{field} grew {before} -> {now}: held back by {what} {held:.1f} s of {seconds:.0f} s "
                    f"({held / seconds:.0%}, watch at {t.violation_share_watch:.0%})",
                    field,
                    now,
                    before,
                )
            )
    return out


def _watch(rule: str, reason: str, field: str, value: object, previous: object) -> GpuHealthFinding:
    return gpu_finding(
        rule, GpuHealthStatus.DEGRADED, GpuAction.WATCH, reason, field=field, value=value, previous=previous
    )


def _growth(now: int | None, before: int | None) -> int:
    """How much a counter grew; 0 when unknown or when it went down (DCGM or the driver restarted)."""
    if now is None or before is None or now <= before:
        return 0
    return now - before


def _interval_s(s: GpuSample, prev: GpuSample, t: GpuHealthThresholds) -> float:
    if s.observed_at is not None and prev.observed_at is not None:
        try:
            seconds = (s.observed_at - prev.observed_at).total_seconds()
        except TypeError:  # one naive, one aware
            seconds = 0.0
        if seconds > 0:
            return seconds
    return t.assumed_interval_s
