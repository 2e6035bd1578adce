"""One verdict per GPU from NVML and DCGM (``workflows.policy.gpu_merge``), the DCGM-only rules, and what the
merged verdict does to attribution (rule 1) and to a drained node's health check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
from workflows.domain.gpu_sources import DcgmNodeRead, DcgmReadResult
from workflows.domain.incident import ActionRung, EvidenceKind, FailureClass, LogFinding
from workflows.policy.attribution import AttributionFacts, attribute, block_rank_layout
from workflows.policy.gpu_health import gpu_health_verdict
from workflows.policy.gpu_merge import (
    dcgm_evidence,
    health_check_outcome,
    health_check_with_dcgm,
    merge_node_verdicts,
    unreadable_sources,
)
from workflows.policy.gpu_thresholds import DEFAULT_THRESHOLDS

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)
CATALOG = XidCatalog(
    entries=(XidCatalogEntry(xid=79, mnemonic="FELL_OFF", meaning="fell off the bus", action="RESTART_BM"),)
)


def _s(index: int, **kw: object) -> GpuSample:
    return GpuSample(host="n2", index=index, uuid=f"GPU-{index}", observed_at=T0, **kw)


def _verdict(source: str, *samples: GpuSample, error: str = "", previous: tuple[GpuSample, ...] = ()) -> NodeGpuVerdict:
    return gpu_health_verdict("n2", samples, catalog=CATALOG, previous=previous, source=source, source_error=error)


HEALTHY_NVML = _verdict("nvml", _s(0), _s(1))
DBE_DCGM = _verdict("dcgm", _s(0), _s(1, ecc_uncorrected_volatile=2))


def test_the_stronger_evidence_wins_and_the_disagreement_is_named() -> None:
    m = merge_node_verdicts("n2", (HEALTHY_NVML, DBE_DCGM))
    assert (m.source, m.status, m.action) == ("nvml+dcgm", GpuHealthStatus.FAILED, GpuAction.RESET_GPU)
    assert [g.index for g in m.gpus] == [0, 1]  # one verdict per GPU
    g1 = m.gpus[1]
    assert g1.status is GpuHealthStatus.FAILED
    assert {(f.rule, f.source) for f in g1.findings} == {
        ("ecc_dbe_volatile", "dcgm"),
        ("sources_disagree", "nvml+dcgm"),
    }
    assert g1.reasons[0].startswith("dcgm: ecc_uncorrected_volatile=2")
    assert g1.reasons[1] == (
        "sources disagree: nvml reads it healthy, dcgm reads it failed: the stronger evidence is kept"
    )
    assert m.gpus[0].findings == ()  # both say healthy: nothing to say
    assert any(r.startswith("GPU 1: dcgm: ") for r in m.reasons)


def test_gpus_match_by_uuid_then_by_index() -> None:
    nvml = _verdict("nvml", GpuSample(host="n2", index=0, uuid="GPU-a"), GpuSample(host="n2", index=1, uuid="GPU-b"))
    # DCGM numbers GPUs its own way: the UUID decides; a GPU without a UUID falls back to the index.
    dcgm = _verdict(
        "dcgm", GpuSample(host="n2", index=7, uuid="GPU-b", remap_failure=True), GpuSample(host="n2", index=0)
    )
    m = merge_node_verdicts("n2", (nvml, dcgm))
    assert [(g.index, g.uuid, g.status.value) for g in m.gpus] == [(0, "GPU-a", "healthy"), (1, "GPU-b", "failed")]


def test_a_gpu_only_one_readable_source_lists_is_named() -> None:
    m = merge_node_verdicts("n2", (_verdict("nvml", _s(0), _s(1)), _verdict("dcgm", _s(0))))
    assert m.gpus[1].reasons == ("sources disagree: listed by nvml, not by dcgm",)
    assert m.status is GpuHealthStatus.HEALTHY  # named, not judged: the stronger evidence decides
    down = merge_node_verdicts("n2", (_verdict("nvml", _s(0), _s(1)), _verdict("dcgm", error="refused")))
    assert all(not g.findings for g in down.gpus)  # an unreadable source lists nothing: no disagreement


def test_an_unreadable_source_is_never_healthy() -> None:
    m = merge_node_verdicts(
        "n2", (HEALTHY_NVML, _verdict("dcgm", error="DCGM exporter http://n2:9400: cannot connect"))
    )
    assert m.status is GpuHealthStatus.DEGRADED
    (down,) = unreadable_sources(m)
    assert (down.source, down.reason) == ("dcgm", "dcgm: no GPU data: DCGM exporter http://n2:9400: cannot connect")
    assert health_check_outcome(m) == (False, "dcgm: no GPU data: DCGM exporter http://n2:9400: cannot connect")


def test_health_check_outcomes() -> None:
    assert health_check_outcome(merge_node_verdicts("n2", (HEALTHY_NVML, _verdict("dcgm", _s(0), _s(1))))) == (
        True,
        "2 GPU(s) healthy (nvml+dcgm)",
    )
    ok, detail = health_check_outcome(merge_node_verdicts("n2", (HEALTHY_NVML, DBE_DCGM)))
    assert not ok and detail.startswith("GPU 1: dcgm: ecc_uncorrected_volatile=2"), detail
    hot = merge_node_verdicts("n2", (HEALTHY_NVML, _verdict("dcgm", _s(0, temperature_c=90), _s(1))))
    ok, detail = health_check_outcome(hot)
    assert ok and detail.startswith("2 GPU(s) fit, watched (nvml+dcgm): GPU 0: dcgm: temperature_c=90"), detail


def _read(node: str, verdict: NodeGpuVerdict | None, *, configured: bool = True) -> DcgmReadResult:
    report = GpuHealthReport(host=node) if configured else None
    return DcgmReadResult(nodes=(DcgmNodeRead(node=node, configured=configured, report=report, verdict=verdict),))


def test_health_check_with_dcgm() -> None:
    nvml_ok = (True, "2 GPU(s) healthy")
    # No exporter for the node: the agent's check stands.
    assert health_check_with_dcgm("n2", HEALTHY_NVML, nvml_ok, _read("n2", None, configured=False)) == nvml_ok
    # DCGM fails a GPU NVML passes: the check fails, naming DCGM.
    ok, detail = health_check_with_dcgm("n2", HEALTHY_NVML, nvml_ok, _read("n2", DBE_DCGM))
    assert not ok and "dcgm: ecc_uncorrected_volatile=2" in detail
    # The exporter is down, or the read itself failed: not passed.
    ok, detail = health_check_with_dcgm("n2", HEALTHY_NVML, nvml_ok, _read("n2", _verdict("dcgm", error="refused")))
    assert (ok, detail) == (False, "dcgm: no GPU data: refused")
    assert health_check_with_dcgm("n2", HEALTHY_NVML, nvml_ok, None)[0] is False
    # The agent failed and DCGM is fine: still failed, with the agent's reason.
    failed = (False, "node agent did not answer: timeout")
    ok_dcgm = _read("n2", _verdict("dcgm", _s(0), _s(1)))
    assert health_check_with_dcgm("n2", None, failed, ok_dcgm) == failed


def test_dcgm_evidence_keeps_configured_nodes_and_says_what_each_read() -> None:
    merged = merge_node_verdicts("n2", (HEALTHY_NVML, DBE_DCGM))
    read = DcgmReadResult(
        nodes=(
            DcgmNodeRead(node="n1", configured=False),
            DcgmNodeRead(node="n2", configured=True, verdict=DBE_DCGM, merged=merged),
        )
    )
    verdicts, notes = dcgm_evidence(("n1", "n2"), read)
    assert verdicts == (merged,)
    assert notes[0].startswith("n2 nvml+dcgm: failed: GPU 1: dcgm: ecc_uncorrected_volatile=2")
    assert dcgm_evidence(("n1",), None) == (
        (),
        ["DCGM exporters not read: the read failed (no DCGM evidence; not taken as healthy)"],
    )


# ----- attribution -------------------------------------------------------------------------------------------------
NODES = ("n1", "n2")
CRASH = LogFinding(kind="rank_exit", rank=3, culprit=True, text="rank 3 exited with code 1")


def _facts(**kw: object) -> AttributionFacts:
    return AttributionFacts(job_nodes=NODES, rank_nodes=block_rank_layout(NODES, 4), findings=[CRASH], **kw)  # type: ignore[arg-type]


def test_a_rank_crash_on_a_gpu_dcgm_fails_is_the_gpus_fault() -> None:
    before = attribute(_facts())
    assert (before.cause, before.action) == ("rank-crash", ActionRung.EXCLUDE)
    a = attribute(_facts(gpu_verdicts=[merge_node_verdicts("n2", (HEALTHY_NVML, DBE_DCGM))]))
    assert (a.failure_class, a.cause, a.implicated_nodes, a.implicated_gpus) == (
        FailureClass.HARDWARE,
        "ecc-dbe-volatile",
        ("n2",),
        ("n2:1",),
    )
    assert (a.basis, a.action) == (EvidenceKind.GPU_DCGM, ActionRung.DRAIN)
    assert a.explanation.startswith("GPU 1 of n2 failed: dcgm: ecc_uncorrected_volatile=2")
    assert "nvml reads it healthy, dcgm reads it failed" in a.explanation
    assert [e.text.split(":")[0] for e in a.evidence] == ["GPU 1 ecc_dbe_volatile", "GPU 1 sources_disagree"]
    assert "dcgm: ecc_uncorrected_volatile=2" in a.evidence[0].text


def test_verdicts_that_fail_nothing_or_name_other_nodes_change_nothing() -> None:
    watched = merge_node_verdicts("n2", (HEALTHY_NVML, _verdict("dcgm", _s(0, temperature_c=95), _s(1))))
    other = merge_node_verdicts("n4", (DBE_DCGM.model_copy(update={"host": "n4"}),))
    assert attribute(_facts(gpu_verdicts=[watched, other])).cause == "rank-crash"


def test_an_event_still_decides_and_the_dcgm_failure_joins_its_evidence() -> None:
    xid = GpuEvent(kind=GpuEventKind.XID, host="n1", index=0, xid=79, source="nvml", observed_at=T0)
    a = attribute(_facts(gpu_events=[xid], gpu_verdicts=[merge_node_verdicts("n2", (HEALTHY_NVML, DBE_DCGM))]))
    assert (a.cause, a.implicated_nodes, a.implicated_gpus, a.basis) == (
        "xid-79",
        ("n1", "n2"),
        ("n1:0", "n2:1"),
        EvidenceKind.GPU_AGENT,
    )
    assert a.evidence[0].text == "[nvml] xid gpu=0 uuid= xid=79"
    assert any(e.text.startswith("GPU 1 ecc_dbe_volatile: dcgm: ") for e in a.evidence)


# ----- the DCGM-only rules ------------------------------------------------------------------------------------------
def _rules(now: GpuSample, before: GpuSample | None) -> dict[str, str]:
    v = gpu_health_verdict(
        "n2", (now,), catalog=CATALOG, previous=(before,) if before else (), thresholds=DEFAULT_THRESHOLDS
    )
    return {f.rule: f.status.value for f in v.gpus[0].findings}


def test_nvlink_recoveries_replays_and_violation_time_need_a_baseline() -> None:
    later = T0 + timedelta(seconds=30)
    before = _s(0, nvlink_recovery_errors=1, nvlink_replay_errors=10, power_violation_us=0, thermal_violation_us=0)
    now = GpuSample(
        host="n2",
        index=0,
        uuid="GPU-0",
        observed_at=later,
        nvlink_recovery_errors=2,
        nvlink_replay_errors=100,  # 3/s, above 1/s
        power_violation_us=20_000_000,  # 20 s of 30 s held by the power limit
        thermal_violation_us=1_000_000,  # 1 s of 30: below half
    )
    assert _rules(now, before) == {
        "nvlink_recovery_growth": "degraded",
        "nvlink_replay_growth": "degraded",
        "power_violation": "degraded",
    }
    assert _rules(now, None) == {}  # a snapshot's totals since DCGM started say nothing about now
    assert _rules(now.model_copy(update={"nvlink_recovery_errors": 0}), before) == {  # reset, not growth
        "nvlink_replay_growth": "degraded",
        "power_violation": "degraded",
    }


def test_the_last_xid_gauge_without_a_baseline_is_named_not_judged() -> None:
    assert _rules(_s(0, last_xid=79), None) == {"dcgm_last_xid": "healthy"}
    assert _rules(_s(0, last_xid=79), _s(0, last_xid=79)) == {}
