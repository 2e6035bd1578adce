"""End to end: a DCGM exporter page showing a fault moves the verdict (issue 14, "DCGM in the loop").

A real HTTP server on the lab host serves a dcgm-exporter page for the node of the rank about to crash, built
from that node's own GPUs (the UUIDs its agent reads through the fake NVML) with two double-bit ECC errors on
GPU 1. The lab's settings file names that node's exporter (``gpu.dcgm_url_template`` + ``gpu.dcgm_nodes``; the
worker re-reads it at every DCGM read, no restart). Without DCGM a lone rank crash is the job's word against its
node: a suspicion, ``rank-crash``, exclude (``test_recovery_scenarios``). With the page, attribution reads DCGM
beside NVML and blames GPU 1 of that node, naming DCGM, on node-level evidence.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deploy.demo.inject import inject
from deploy.demo.injections import live_rank
from tests.e2e.recovery_support import DRAIN_PREFIX, monitored_demo, sinfo_drains
from tests.gpu.exporter import exporter_page, running_exporter
from tests.lab_support import LabHandle, end_fleet, lab_rebound_settings
from workers.nodes_cli import read_node_gpus
from workflows.domain.incident import EvidenceKind, FailureClass

pytestmark = pytest.mark.slow

CRASHING_RANK = 3


@contextmanager
def dcgm_configured(config: Path, template: str, node: str) -> Iterator[None]:
    """Name ``node``'s exporter in the lab's settings file for the test; the file is put back afterwards."""
    before = config.read_text()
    config.write_text(f'{before.rstrip()}\n\n[gpu]\ndcgm_url_template = "{template}"\ndcgm_nodes = ["{node}"]\n')
    try:
        yield
    finally:
        config.write_text(before)


def _rank_node(lab: LabHandle, run: str, rank: int) -> str | None:
    try:
        return live_rank(lab.layout, run, rank).node
    except Exception:  # noqa: BLE001 - not started yet: keep polling
        return None


async def test_a_dcgm_page_showing_a_failed_gpu_moves_the_verdict(lab: LabHandle) -> None:
    started = time.monotonic()
    async with monitored_demo(lab, "dcgm", checkpoint=False) as (job, rec):
        node = lab.wait_for(lambda: _rank_node(lab, job.run, CRASHING_RANK), 20)
        assert isinstance(node, str)
        read = await read_node_gpus(lab_rebound_settings(lab), node)
        assert read.report is not None and read.report.samples, read.error
        gpus = [(s.index, s.uuid, s.pci_bus_id) for s in read.report.samples]
        page = exporter_page(node, gpus, {1: {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2}})
        with (
            running_exporter() as exporter,
            dcgm_configured(lab.layout.rebound_config, exporter.url.replace("/metrics", "/{node}/metrics"), node),
        ):
            exporter.state.pages[f"/{node}/metrics"] = page.encode()
            try:
                record = inject(lab.layout, "crash", run=job.run, rank=CRASHING_RANK)
                assert record.node == node
                st = await rec.wait(
                    lambda s: bool(s.incidents) and s.incidents[0].attribution is not None, 40, "an attribution"
                )
                att = st.incidents[0].attribution
                assert att is not None
                assert (att.failure_class, att.cause, att.basis) == (
                    FailureClass.HARDWARE,
                    "ecc-dbe-volatile",
                    EvidenceKind.GPU_DCGM,
                ), rec.describe()
                assert att.implicated_nodes == (node,) and att.implicated_gpus == (f"{node}:1",), att
                assert any(e.text.startswith("GPU 1 ecc_dbe_volatile: dcgm: ") for e in att.evidence), att.evidence
                # NVML (the fake, healthy) and DCGM disagree: the stronger evidence won, and it says so.
                assert "nvml reads it healthy, dcgm reads it failed" in att.explanation, att.explanation
                verdicts = [e.detail for e in st.timeline if e.event == "GPU_VERDICT"]
                assert verdicts and verdicts[0].startswith(f"{node} nvml+dcgm: failed: "), verdicts
                assert exporter.state.paths and set(exporter.state.paths) == {f"/{node}/metrics"}
            finally:
                await rec.retire()
                for drained, reason in sinfo_drains(lab).items():  # the Fleet may have drained it: undo
                    if reason.startswith(DRAIN_PREFIX.strip()):
                        lab.slurm("scontrol", "update", f"nodename={drained}", "state=resume", check=False)
                await end_fleet(lab, "dcgm test done")
    print(f"\nDCGM in the loop: {time.monotonic() - started:.1f} s")
