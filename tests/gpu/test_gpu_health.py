"""The GPU health verdict (pure) and the XID catalogue it is given: every rule, every XID class."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.gpu.dcgm_page import parse_exporter_page
from activities.gpu.xid_catalog import CATALOG_FILE, default_xid_catalog, load_xid_catalog, parse_xid_catalog
from tests.gpu.exporter import page
from workflows.domain.errors import FailureKind, ReboundError
from workflows.domain.gpu import (
    GpuAction,
    GpuEvent,
    GpuEventKind,
    GpuHealthReport,
    GpuHealthStatus,
    GpuSample,
    NodeGpuVerdict,
    XidCatalog,
    XidCatalogEntry,
)
from workflows.policy.gpu_event_rules import xid_verdict
from workflows.policy.gpu_health import gpu_health_verdict, verdict_for_report
from workflows.policy.gpu_sample_rules import decode_clocks_event_reasons
from workflows.policy.gpu_thresholds import GpuHealthThresholds

H, D, F = GpuHealthStatus.HEALTHY, GpuHealthStatus.DEGRADED, GpuHealthStatus.FAILED
CATALOG = default_xid_catalog()
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def _s(index: int = 0, **fields: object) -> GpuSample:
    return GpuSample.model_validate({"host": "n1", "index": index, "uuid": f"GPU-{index}", **fields})


def _verdict(
    samples: list[GpuSample],
    previous: list[GpuSample] | None = None,
    events: list[GpuEvent] | None = None,
    **kw: object,
) -> NodeGpuVerdict:
    return gpu_health_verdict("n1", samples, previous=previous or [], events=events or [], catalog=CATALOG, **kw)  # type: ignore[arg-type]


def _rules(v: NodeGpuVerdict) -> list[tuple[int | None, str, GpuHealthStatus, GpuAction]]:
    return [(g.index, f.rule, f.status, f.action) for g in v.gpus for f in g.findings]


# ------------------------------------------------------------------------------------------- the catalogue


def test_packaged_catalogue_loads_and_matches_the_shared_table() -> None:
    assert len(CATALOG.entries) == 172 and CATALOG.version == f"{CATALOG_FILE} (172 XIDs)"
    xid79 = CATALOG.get(79)
    assert xid79 is not None
    assert (xid79.mnemonic, xid79.meaning, xid79.action) == (
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        "RESTART_BM",
    )
    assert CATALOG.get(999) is None
    shared = Path("/work/shared/data/xid_catalog.tsv")
    if shared.exists():  # the packaged copy must not drift from the shared table it was taken from
        assert load_xid_catalog(shared).entries == CATALOG.entries


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "line 1: empty file"),
        ("xid\tmnemonic\n", "line 1: header lacks column(s) name_meaning, nvidia_immediate_action"),
        ("xid\tmnemonic\tname_meaning\tnvidia_immediate_action\n13\tX\tY\n", "line 2: 3 fields, the header has 4"),
        ("xid\tmnemonic\tname_meaning\tnvidia_immediate_action\nx13\tX\tY\tIGNORE\n", "line 2: xid 'x13'"),
        (
            "xid\tmnemonic\tname_meaning\tnvidia_immediate_action\n13\tX\tY\tIGNORE\n13\tX\tY\tIGNORE\n",
            "line 3: xid 13 is listed twice",
        ),
    ],
)
def test_a_broken_catalogue_is_a_configuration_error(text: str, problem: str) -> None:
    with pytest.raises(ReboundError) as caught:
        parse_xid_catalog(text, origin="t.tsv")
    assert caught.value.kind is FailureKind.CONFIGURATION
    assert f"XID catalogue t.tsv {problem}" in caught.value.message


def test_missing_catalogue_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ReboundError) as caught:
        load_xid_catalog(tmp_path / "nope.tsv")
    assert caught.value.kind is FailureKind.CONFIGURATION and "cannot read" in caught.value.message


def test_minimal_catalogue_without_optional_columns() -> None:
    catalog = parse_xid_catalog("xid\tmnemonic\tname_meaning\tnvidia_immediate_action\textra\n13\tGR\tGraphics\t\tz\n")
    assert catalog.entries == (XidCatalogEntry(xid=13, mnemonic="GR", meaning="Graphics", action="-"),)


# ------------------------------------------------------------------------------------------- XID classes


@pytest.mark.parametrize(
    ("xid", "status", "action", "bucket"),
    [
        (13, D, GpuAction.RESTART_JOB, "RESTART_APP"),  # graphics engine exception: the job's, not the GPU's
        (31, D, GpuAction.RESTART_JOB, "RESTART_APP"),
        (94, D, GpuAction.RESTART_JOB, "RESTART_APP"),  # contained ECC error
        (45, D, GpuAction.RESTART_JOB, "WORKFLOW_XID_45"),
        (43, H, GpuAction.NONE, "IGNORE"),
        (92, H, GpuAction.NONE, "IGNORE"),
        (159, D, GpuAction.WATCH, "CHECK_UVM"),
        (48, F, GpuAction.RESET_GPU, "WORKFLOW_XID_48"),  # double-bit ECC
        (95, F, GpuAction.RESET_GPU, "RESET_GPU"),  # uncontained ECC
        (64, F, GpuAction.RESET_GPU, "RESET_GPU"),
        (119, F, GpuAction.RESET_GPU, "RESET_GPU"),  # GSP RPC timeout
        (74, F, GpuAction.RESET_GPU, "WORKFLOW_NVLINK_ERR"),
        (145, F, GpuAction.RESET_GPU, "WORKFLOW_NVLINK5_ERR"),
        (79, F, GpuAction.DRAIN_NODE, "RESTART_BM"),  # fell off the bus
        (151, F, GpuAction.DRAIN_NODE, "RESTART_VM"),
        (54, F, GpuAction.DRAIN_NODE, "CHECK_MECHANICALS"),
        (78, F, GpuAction.DRAIN_NODE, "UPDATE_SWFW"),
        (1, F, GpuAction.DRAIN_NODE, "CONTACT_SUPPORT"),
        (154, F, GpuAction.DRAIN_NODE, "XID_154"),
        (162, F, GpuAction.RESET_GPU, "RESET_GPU"),  # NVIDIA gives no action; NVSentinel's is used
    ],
)
def test_xid_classes_follow_the_catalogue(xid: int, status: GpuHealthStatus, action: GpuAction, bucket: str) -> None:
    got_status, got_action, text = xid_verdict(xid, CATALOG)
    assert (got_status, got_action) == (status, action)
    entry = CATALOG.get(xid)
    assert entry is not None
    assert text.startswith(f"XID {xid} ({entry.mnemonic}: {entry.meaning}): catalogue action {bucket}")


def test_xid_without_any_action_or_unknown_is_watched() -> None:
    status, action, text = xid_verdict(171, CATALOG)  # listed, no action in either column
    assert (status, action) == (D, GpuAction.WATCH) and "the catalogue gives no action" in text
    status, action, text = xid_verdict(999, CATALOG)
    assert (status, action) == (D, GpuAction.WATCH)
    assert text == f"XID 999 is not in the XID catalogue ({CATALOG.version}): watch"
    assert xid_verdict(13, XidCatalog())[1] is GpuAction.WATCH  # an empty catalogue knows nothing


def test_an_application_xid_repeated_on_one_gpu_drains() -> None:
    events = [GpuEvent(kind=GpuEventKind.XID, host="n1", index=2, uuid="GPU-2", xid=13) for _ in range(3)]
    v = _verdict([_s(2)], events=events)
    assert (v.status, v.action) == (F, GpuAction.DRAIN_NODE)
    assert "XID 13 3 times on this GPU (limit 3)" in v.gpus[0].reasons[-1]
    two = _verdict([_s(2)], events=events[:2])
    assert (two.status, two.action) == (D, GpuAction.RESTART_JOB)
    assert len(two.gpus[0].reasons) == 1  # the same sentence once, not once per event


# ------------------------------------------------------------------------------------------- sample rules


def test_healthy_sample_has_no_findings() -> None:
    fine = _s(0, temperature_c=60, ecc_uncorrected_volatile=0, remap_failure=False, clocks_event_reasons=0x1)
    v = _verdict([fine], previous=[fine])
    assert (v.status, v.action, v.reasons, v.gpus[0].findings) == (H, GpuAction.NONE, (), ())


@pytest.mark.parametrize(
    ("fields", "rule", "status", "action", "words"),
    [
        ({"lost": True}, "gpu_lost", F, GpuAction.DRAIN_NODE, "lost=True"),
        ({"missing": True}, "gpu_missing", F, GpuAction.DRAIN_NODE, "missing=True"),
        ({"ecc_uncorrected_volatile": 2}, "ecc_dbe_volatile", F, GpuAction.RESET_GPU, "ecc_uncorrected_volatile=2"),
        ({"remap_failure": True}, "row_remap_failure", F, GpuAction.DRAIN_NODE, "remap_failure=True"),
        (
            {"retired_pages_sbe": 50, "retired_pages_dbe": 13},
            "retired_pages_limit",
            F,
            GpuAction.DRAIN_NODE,
            "retired_pages_sbe+retired_pages_dbe=63 reached the limit 63",
        ),
        ({"retired_pages_pending": True}, "retired_pages_pending", D, GpuAction.WATCH, "retired_pages_pending=True"),
        ({"remap_pending": True}, "row_remap_pending", D, GpuAction.WATCH, "remap_pending=True"),
        (
            {"clocks_event_reasons": 0x40, "temperature_c": 84, "sm_clock_mhz": 1275, "sm_clock_max_mhz": 1980},
            "thermal_throttle",
            D,
            GpuAction.WATCH,
            "clocks_event_reasons=0x40 (hw_thermal_slowdown): thermal slowdown, 84 C, SM clock 1275/1980 MHz",
        ),
        (
            {"clocks_event_reasons": 0x24},
            "thermal_throttle",
            D,
            GpuAction.WATCH,
            "clocks_event_reasons=0x24 (sw_thermal_slowdown)",
        ),
        (
            {"clocks_event_reasons": 0x80},
            "hw_slowdown",
            D,
            GpuAction.WATCH,
            "(hw_power_brake_slowdown): hardware slowdown",
        ),
        ({"temperature_c": 85}, "temperature_high", D, GpuAction.WATCH, "temperature_c=85 is at or above 85"),
    ],
)
def test_each_sample_rule(
    fields: dict[str, object], rule: str, status: GpuHealthStatus, action: GpuAction, words: str
) -> None:
    v = _verdict([_s(1, **fields)])
    assert _rules(v) == [(1, rule, status, action)]
    assert (v.status, v.action) == (status, action)
    assert words in v.gpus[0].reasons[0]
    assert v.reasons == (f"GPU 1: {v.gpus[0].reasons[0]}",)


def test_power_cap_and_idle_are_not_throttling_findings() -> None:
    assert _rules(_verdict([_s(0, clocks_event_reasons=0x1 | 0x4 | 0x10)])) == []
    assert decode_clocks_event_reasons(0x1 | 0x4 | 0x40 | 0x800) == (
        "gpu_idle",
        "sw_power_cap",
        "hw_thermal_slowdown",
        "bit_0x800",
    )


# ------------------------------------------------------------------------------------------- growth rules


@pytest.mark.parametrize(
    ("field", "before", "after", "rule", "status", "action"),
    [
        ("ecc_corrected_volatile", 3, 17, "ecc_sbe_growth", D, GpuAction.WATCH),
        ("ecc_corrected_aggregate", 3, 4, "ecc_sbe_growth", D, GpuAction.WATCH),
        ("ecc_uncorrected_aggregate", 0, 1, "ecc_dbe_aggregate_growth", F, GpuAction.RESET_GPU),
        ("retired_pages_sbe", 1, 2, "retired_pages_growth", D, GpuAction.WATCH),
        ("retired_pages_dbe", 0, 1, "retired_pages_growth", D, GpuAction.WATCH),
        ("remapped_rows_uncorrectable", 1, 2, "row_remap_uncorrectable_growth", D, GpuAction.WATCH),
        ("pcie_replay_count", 0, 9, "pcie_replay_growth", D, GpuAction.WATCH),  # 9 a minute > DCGM's 8
        ("nvlink_crc_errors", 0, 6000, "nvlink_crc_growth", D, GpuAction.WATCH),  # 100/s over 60 s
    ],
)
def test_each_growth_rule(
    field: str, before: int, after: int, rule: str, status: GpuHealthStatus, action: GpuAction
) -> None:
    prev, now = (
        _s(0, observed_at=T0, **{field: before}),
        _s(0, observed_at=T0 + timedelta(seconds=60), **{field: after}),
    )
    v = _verdict([now], previous=[prev])
    assert _rules(v) == [(0, rule, status, action)]
    finding = v.gpus[0].findings[0]
    assert (finding.field, finding.value, finding.previous) == (field, str(after), str(before))
    assert f"{field} grew {before} -> {after}" in finding.reason
    assert _rules(_verdict([now])) == []  # no previous sample: no growth to see


def test_growth_below_the_rate_limits_is_not_a_finding() -> None:
    prev = _s(0, pcie_replay_count=0, nvlink_crc_errors=0, observed_at=T0)
    now = _s(0, pcie_replay_count=8, nvlink_crc_errors=5999, observed_at=T0 + timedelta(seconds=60))
    assert _rules(_verdict([now], previous=[prev])) == []
    # Same growth in 6 s is ten times the rate: both fire.
    fast = now.model_copy(update={"observed_at": T0 + timedelta(seconds=6)})
    assert [r[1] for r in _rules(_verdict([fast], previous=[prev]))] == ["pcie_replay_growth", "nvlink_crc_growth"]
    # Without times the interval is taken as assumed_interval_s.
    untimed = [now.model_copy(update={"observed_at": None})]
    assert _rules(_verdict(untimed, previous=[prev], thresholds=GpuHealthThresholds(assumed_interval_s=6))) != []


def test_counters_that_went_down_were_reset_not_grown() -> None:
    prev = _s(0, ecc_corrected_volatile=50, ecc_corrected_aggregate=50, pcie_replay_count=90)
    now = _s(0, ecc_corrected_volatile=0, ecc_corrected_aggregate=50, pcie_replay_count=0)
    assert _rules(_verdict([now], previous=[prev])) == []
    # After a reset the volatile counter restarts; aggregate growth still shows new corrected errors.
    grown = now.model_copy(update={"ecc_corrected_aggregate": 52})
    assert [r[1] for r in _rules(_verdict([grown], previous=[prev]))] == ["ecc_sbe_growth"]


def test_previous_samples_are_matched_by_uuid() -> None:
    prev = [_s(0, ecc_corrected_volatile=0), _s(1, ecc_corrected_volatile=100)]
    # Indices swapped (the exporter renumbered): comparing by index would invent growth on GPU-0.
    now = [
        _s(0, ecc_corrected_volatile=100).model_copy(update={"uuid": "GPU-1"}),
        _s(1, ecc_corrected_volatile=0).model_copy(update={"uuid": "GPU-0"}),
    ]
    assert _rules(_verdict(now, previous=prev)) == []


# ------------------------------------------------------------------------------------------- events, nodes


def test_event_rules_and_pinning() -> None:
    events = [
        GpuEvent(kind=GpuEventKind.ECC_DBE, host="n1", index=0, uuid="GPU-0", source="nvml"),
        GpuEvent(kind=GpuEventKind.GPU_LOST, host="n1", index=1, uuid="GPU-1", source="nvml"),
        GpuEvent(kind=GpuEventKind.GPU_MISSING, host="n1", index=5, uuid="GPU-5", source="dcgm"),
        GpuEvent(kind=GpuEventKind.XID, host="n1", xid=79, source="nvml"),  # device unknown: node level
    ]
    v = _verdict([_s(0), _s(1)], events=events)
    assert _rules(v) == [
        (0, "ecc_dbe_event", F, GpuAction.RESET_GPU),
        (1, "gpu_lost", F, GpuAction.DRAIN_NODE),
        (5, "gpu_missing", F, GpuAction.DRAIN_NODE),  # a GPU with no sample still gets its verdict
    ]
    assert [(f.rule, f.xid) for f in v.findings] == [("xid", 79)]
    assert v.findings[0].reason.endswith("(GPU unknown)")
    assert (v.status, v.action) == (F, GpuAction.DRAIN_NODE)
    assert [g.index for g in v.gpus] == [0, 1, 5]


def test_an_event_without_uuid_lands_on_its_gpu_by_index() -> None:
    v = _verdict([_s(3)], events=[GpuEvent(kind=GpuEventKind.XID, host="n1", index=3, xid=31)])
    assert _rules(v) == [(3, "xid", D, GpuAction.RESTART_JOB)]


def test_node_takes_the_worst_gpu() -> None:
    v = _verdict([_s(0, temperature_c=90), _s(1, ecc_uncorrected_volatile=1), _s(2)])
    assert [(g.index, g.status, g.action) for g in v.gpus] == [
        (0, D, GpuAction.WATCH),
        (1, F, GpuAction.RESET_GPU),
        (2, H, GpuAction.NONE),
    ]
    assert (v.status, v.action) == (F, GpuAction.RESET_GPU)
    assert [r.split(":")[0] for r in v.reasons] == ["GPU 0", "GPU 1"]


def test_source_down_is_a_node_level_watch() -> None:
    down = GpuEvent(kind=GpuEventKind.SOURCE_DOWN, host="n1", source="dcgm")
    v = _verdict([], events=[down])
    assert [(f.rule, f.status, f.action, f.reason) for f in v.findings] == [
        ("source_down", D, GpuAction.WATCH, "dcgm down")
    ]
    report = GpuHealthReport(host="n1", events=(down,), error="GPU_SOURCE_UNAVAILABLE: refused")
    v2 = verdict_for_report(report, catalog=CATALOG, source="dcgm")
    assert [f.reason for f in v2.findings] == ["no GPU data: GPU_SOURCE_UNAVAILABLE: refused"]  # once, not twice
    assert (v2.status, v2.action, v2.source) == (D, GpuAction.WATCH, "dcgm")


def test_the_verdict_is_deterministic_and_survives_json() -> None:
    samples = list(parse_exporter_page(page("h100-8gpu-faults.prom"), "n1").samples)
    a = _verdict(samples, previous=list(parse_exporter_page(page("h100-8gpu-healthy.prom"), "n1").samples))
    b = _verdict(list(samples), previous=list(parse_exporter_page(page("h100-8gpu-healthy.prom"), "n1").samples))
    assert a == b
    assert NodeGpuVerdict.model_validate_json(a.model_dump_json()) == a


def test_thresholds_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        GpuHealthThresholds(temperature_watch_c=0)
    with pytest.raises(ValueError):
        GpuHealthThresholds(xid_repeats_drain=1)
