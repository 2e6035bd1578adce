"""Records of the central DCGM-exporter read that attribution and health checks make beside the node agent's NVML
read (``dcgm_read_gpus``), kept apart from ``workflows.domain.gpu`` (the records every GPU source shares)."""

from __future__ import annotations

from workflows.domain.base import Frozen
from workflows.domain.gpu import GpuHealthReport, NodeGpuVerdict


class DcgmReadInput(Frozen):
    """Read these nodes' DCGM exporters now (those with one configured; the others are answered as not configured)."""

    nodes: tuple[str, ...]
    nvml: tuple[GpuHealthReport, ...] = ()
    """The node agents' NVML reads of the same nodes, where the caller has them: each configured node's reading
    then also comes merged with its NVML verdict (``DcgmNodeRead.merged``)."""


class DcgmNodeRead(Frozen):
    """One node's DCGM reading, or that it has no exporter configured.

    ``configured=False``: no exporter URL applies to the node (no ``gpu.dcgm_url_template``, or the node is not
    in ``gpu.dcgm_nodes``): nothing was read and nothing is claimed. Configured, an exporter that is down or serves
    garbage gives ``report.error`` and a verdict with a ``source_down`` finding: a failed lookup, never "healthy".
    """

    node: str
    configured: bool
    url: str = ""
    report: GpuHealthReport | None = None
    verdict: NodeGpuVerdict | None = None
    """DCGM's own verdict (``source="dcgm"``)."""
    merged: NodeGpuVerdict | None = None
    """One verdict per GPU from the NVML read given in the input and this one (``workflows.policy.gpu_merge``);
    None without an NVML read of the node."""


class DcgmReadResult(Frozen):
    """One ``DcgmNodeRead`` per node asked, in the order asked."""

    nodes: tuple[DcgmNodeRead, ...] = ()

    def get(self, node: str) -> DcgmNodeRead | None:
        """The node's reading, or None when it was not asked."""
        return next((r for r in self.nodes if r.node == node), None)
