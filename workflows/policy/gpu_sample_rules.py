"""GPU health rules over one GPU's sample and the one before it: lost/missing, ECC, retired pages and row remaps,
throttling and temperature, growth of error counters and link error rates. Pure; the rules are listed in
``workflows.policy.gpu_health``.

Counters that go down were reset (reboot, driver reload): that is not growth. Rates use the samples' times;
without them the interval is taken as ``assumed_interval_s``.
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.gpu import GpuAction, GpuHealthFinding, GpuHealthStatus, GpuRecoveryAction, GpuSample
from workflows.policy.gpu_recovery import recovery_verdict
from workflows.policy.gpu_thresholds import GpuHealthThresholds, gpu_finding

__all__ = ["CLOCKS_EVENT_REASONS", "decode_clocks_event_reasons", "sample_findings"]

_H, _D, _F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED

#: NVML's clocks-event ("throttle") reason bits (nvml.h ``nvmlClocksEventReason*``); DCGM exports the same mask.
CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
_THERMAL_BITS = 0x20 | 0x40
_HW_SLOWDOWN_BITS = 0x8 | 0x80


def decode_clocks_event_reasons(mask: int) -> tuple[str, ...]:
    """Names of the set bits of a clocks-event (throttle) mask; unknown bits as ``bit_0x...``."""
    names = [name for bit, name in CLOCKS_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCKS_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    names += [f"bit_{1 << i:#x}" for i in range(rest.bit_length()) if rest & (1 << i)]
    return tuple(names)


def sample_findings(s: GpuSample, prev: GpuSample | None, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    """What one GPU's sample says, against the previous sample of the same GPU (None: no growth rules)."""
    out: list[GpuHealthFinding] = []
    if s.lost:
        out.append(
            gpu_finding(
                "gpu_lost",
                _F,
                GpuAction.DRAIN_NODE,
                "lost=True: the GPU no longer answers (fell off the bus); drain, reboot the host, RMA if it recurs",
                field="lost",
                value=True,
            )
        )
    if s.missing:
        out.append(
            gpu_finding(
                "gpu_missing",
                _F,
                GpuAction.DRAIN_NODE,
                "missing=True: the GPU was listed by the source before and is gone now; drain and check the host",
                field="missing",
                value=True,
            )
        )
    if s.ecc_uncorrected_volatile:
        out.append(
            gpu_finding(
                "ecc_dbe_volatile",
                _F,
                GpuAction.RESET_GPU,
                f"ecc_uncorrected_volatile={s.ecc_uncorrected_volatile}: uncorrectable (double-bit) ECC errors since "
                "the last reset; reset the GPU to remap the rows",
                field="ecc_uncorrected_volatile",
                value=s.ecc_uncorrected_volatile,
            )
        )
    dbe_growth = _growth(s.ecc_uncorrected_aggregate, prev.ecc_uncorrected_aggregate if prev else None)
    if dbe_growth and not s.ecc_uncorrected_volatile:
        out.append(
            gpu_finding(
                "ecc_dbe_aggregate_growth",
                _F,
                GpuAction.RESET_GPU,
                f"ecc_uncorrected_aggregate grew {prev.ecc_uncorrected_aggregate if prev else 0} -> "
                f"{s.ecc_uncorrected_aggregate}: a new uncorrectable ECC error; reset the GPU",
                field="ecc_uncorrected_aggregate",
                value=s.ecc_uncorrected_aggregate,
                previous=prev.ecc_uncorrected_aggregate if prev else "",
            )
        )
    out += _recovery_findings(s)
    if s.remap_failure:
        out.append(
            gpu_finding(
                "row_remap_failure",
                _F,
                GpuAction.DRAIN_NODE,
                "remap_failure=True: the GPU ran out of spare rows to remap; drain and RMA",
                field="remap_failure",
                value=True,
            )
        )
    retired = (s.retired_pages_sbe or 0) + (s.retired_pages_dbe or 0)
    if retired >= t.retired_pages_drain:
        out.append(
            gpu_finding(
                "retired_pages_limit",
                _F,
                GpuAction.DRAIN_NODE,
                f"retired_pages_sbe+retired_pages_dbe={retired} reached the limit {t.retired_pages_drain}: "
                "drain and RMA",
                field="retired_pages_sbe+retired_pages_dbe",
                value=retired,
            )
        )
    if s.retired_pages_pending:
        out.append(
            _watch(
                "retired_pages_pending",
                "retired_pages_pending=True: pages wait for retirement; reset the GPU when it is idle",
                "retired_pages_pending",
                True,
            )
        )
    if s.remap_pending:
        out.append(
            _watch(
                "row_remap_pending",
                "remap_pending=True: a row remap waits for the next GPU reset",
                "remap_pending",
                True,
            )
        )
    out += _throttle_findings(s, t)
    if prev is not None:
        out += _growth_findings(s, prev, t)
    return out


def _recovery_findings(s: GpuSample) -> list[GpuHealthFinding]:
    """``recovery_action``: the driver's own word on what the GPU needs (None, not read: no finding, and never
    taken for ``none``; ``none`` itself: nothing to say)."""
    action = s.recovery_action
    if action is None or action is GpuRecoveryAction.NONE:
        return []
    status, act, text = recovery_verdict(action)
    code = f" (code {s.recovery_action_code})" if action is GpuRecoveryAction.UNKNOWN else ""
    return [
        gpu_finding(
            "recovery_action",
            status,
            act,
            f"recovery_action={action.value}{code}: {text}",
            field="recovery_action",
            value=s.recovery_action_code if action is GpuRecoveryAction.UNKNOWN else action.value,
        )
    ]


def _watch(rule: str, reason: str, field: str, value: object, previous: object = "") -> GpuHealthFinding:
    return gpu_finding(rule, _D, GpuAction.WATCH, reason, field=field, value=value, previous=previous)


def _throttle_findings(s: GpuSample, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    out: list[GpuHealthFinding] = []
    mask = s.clocks_event_reasons or 0
    clocks = ""
    if s.sm_clock_mhz is not None and s.sm_clock_max_mhz:
        clocks = f", SM clock {s.sm_clock_mhz}/{s.sm_clock_max_mhz} MHz"
    elif s.sm_clock_mhz is not None:
        clocks = f", SM clock {s.sm_clock_mhz} MHz"
    temp = f", {s.temperature_c} C" if s.temperature_c is not None else ""
    for rule, bits, what in (
        ("thermal_throttle", _THERMAL_BITS, "thermal slowdown"),
        ("hw_slowdown", _HW_SLOWDOWN_BITS, "hardware slowdown (power brake or HW slowdown)"),
    ):
        if mask & bits:
            names = "+".join(decode_clocks_event_reasons(mask & bits))
            out.append(
                _watch(
                    rule,
                    f"clocks_event_reasons={mask:#x} ({names}): {what}{temp}{clocks}",
                    "clocks_event_reasons",
                    f"{mask:#x}",
                )
            )
    if s.temperature_c is not None and s.temperature_c >= t.temperature_watch_c:
        out.append(
            _watch(
                "temperature_high",
                f"temperature_c={s.temperature_c} is at or above {t.temperature_watch_c}{clocks}",
                "temperature_c",
                s.temperature_c,
            )
        )
    return out


def _growth(now: int | None, before: int | None) -> int:
    """How much a counter grew; 0 when unknown or when it went down (a reset, not growth)."""
    if now is None or before is None or now <= before:
        return 0
    return now - before


def _interval_s(s: GpuSample, prev: GpuSample, t: GpuHealthThresholds) -> float:
    if s.observed_at is not None and prev.observed_at is not None:
        seconds = _seconds(s.observed_at, prev.observed_at)
        if seconds > 0:
            return seconds
    return t.assumed_interval_s


def _seconds(now: datetime, before: datetime) -> float:
    try:
        return (now - before).total_seconds()
    except TypeError:  # one naive, one aware: no usable interval
        return 0.0


def _growth_findings(s: GpuSample, prev: GpuSample, t: GpuHealthThresholds) -> list[GpuHealthFinding]:
    out: list[GpuHealthFinding] = []
    for field, rule, what in (
        ("ecc_corrected_volatile", "ecc_sbe_growth", "corrected (single-bit) ECC errors"),
        ("retired_pages_sbe", "retired_pages_growth", "pages retired for single-bit errors"),
        ("retired_pages_dbe", "retired_pages_growth", "pages retired for double-bit errors"),
        ("remapped_rows_uncorrectable", "row_remap_uncorrectable_growth", "rows remapped for uncorrectable errors"),
    ):
        now, before = getattr(s, field), getattr(prev, field)
        if _growth(now, before):
            out.append(_watch(rule, f"{field} grew {before} -> {now}: more {what}", field, now, before))
    if not _growth(s.ecc_corrected_volatile, prev.ecc_corrected_volatile):
        # Volatile counters restart at a reset; the aggregate one still shows growth across it.
        now, before = s.ecc_corrected_aggregate, prev.ecc_corrected_aggregate
        if _growth(now, before):
            out.append(
                _watch(
                    "ecc_sbe_growth",
                    f"ecc_corrected_aggregate grew {before} -> {now}: more corrected (single-bit) ECC errors",
                    "ecc_corrected_aggregate",
                    now,
                    before,
                )
            )
    seconds = _interval_s(s, prev, t)
    replays = _growth(s.pcie_replay_count, prev.pcie_replay_count)
    if replays and replays * 60 / seconds > t.pcie_replays_per_min:
        out.append(
            _watch(
                "pcie_replay_growth",
                f"pcie_replay_count grew {prev.pcie_replay_count} -> {s.pcie_replay_count} "
                f"({replays * 60 / seconds:.1f}/min over {seconds:.0f} s, limit {t.pcie_replays_per_min:g}/min): "
                "the PCIe link retries; check seating and riser",
                "pcie_replay_count",
                s.pcie_replay_count,
                prev.pcie_replay_count,
            )
        )
    crc = _growth(s.nvlink_crc_errors, prev.nvlink_crc_errors)
    if crc and crc / seconds >= t.nvlink_crc_per_s:
        out.append(
            _watch(
                "nvlink_crc_growth",
                f"nvlink_crc_errors grew {prev.nvlink_crc_errors} -> {s.nvlink_crc_errors} "
                f"({crc / seconds:.0f}/s over {seconds:.0f} s, limit {t.nvlink_crc_per_s:g}/s): NVLink CRC errors",
                "nvlink_crc_errors",
                s.nvlink_crc_errors,
                prev.nvlink_crc_errors,
            )
        )
    return out
