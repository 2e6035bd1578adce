"""What the Fleet reads of the cluster for one decision: the nodes it names, and counts for everything else.

The Fleet used to read the whole ``ClusterSnapshot`` into its history for every decision: 0.7 MB at 1,000 jobs,
3.6 MB at 5,000, past Temporal's 2 MB payload limit (every isolation decision would then fail). Its rules need
far less: the nodes a request or a node record names, in full; how many nodes the cluster and each partition
have (the breaker's caps); and how many placeable nodes of the job's partition could take one of its nodes (the
placement check), by size. ``workflows.policy.fleet.view`` builds this from a snapshot; its size grows with the
nodes named, never with the cluster's jobs or nodes.
"""

from __future__ import annotations

from datetime import datetime

from workflows.domain.base import Frozen
from workflows.domain.slurm import SlurmNode

__all__ = ["FleetView", "FleetViewInput", "JobAllocation", "PlaceableNodes"]


class FleetViewInput(Frozen):
    """What one read for the Fleet must show."""

    nodes: tuple[str, ...] = ()
    """Nodes to show in full: the request's, its exclusions, the nodes the Fleet keeps records of."""
    partition: str | None = None
    """Count the placeable nodes of this partition (comma-separated: any of them; "": the whole cluster); None:
    no placement counts."""
    job_id: int | None = None
    """Show this job's owner and allocation (the request's job): what the Fleet checks a request against."""


class PlaceableNodes(Frozen):
    """How many placeable nodes (up, responding, not drained) of the asked partition have this size."""

    gpus: int | None
    """GPUs per node; None when the scheduler did not say."""
    cpus: int
    """CPUs per node; 0 when unknown."""
    count: int


class JobAllocation(Frozen):
    """A job as the scheduler lists it: who owns it and where it runs (or ran, for a job that just ended)."""

    job_id: int
    listed: bool
    """False: the scheduler does not list the job (unknown, or ended long enough ago to be forgotten)."""
    user: str = ""
    nodes: tuple[str, ...] = ()
    completing: bool = False
    """The job is COMPLETING: Slurm lists only the nodes still completing, not its whole allocation."""


class FleetView(Frozen):
    """The cluster as one Fleet decision needs it (``FleetViewInput`` says what)."""

    observed_at: datetime
    asked: tuple[str, ...] = ()
    """The nodes asked for (``FleetViewInput.nodes``): only these can be looked up."""
    node_count: int
    """All nodes of the cluster (the breaker's cluster cap)."""
    partition_sizes: dict[str, int] = {}
    """Nodes per partition (the breaker's partition caps)."""
    nodes: tuple[SlurmNode, ...] = ()
    """The asked nodes the scheduler lists; an asked node missing here is not part of the cluster."""
    partition: str | None = None
    """The partition ``placeable`` counts (None: not asked)."""
    placeable: tuple[PlaceableNodes, ...] = ()
    job: JobAllocation | None = None
    """The asked job (``FleetViewInput.job_id``); None when none was asked."""

    def node(self, name: str) -> SlurmNode | None:
        """The named node, or None when the cluster has no such node.

        Raises:
            LookupError: ``name`` was not asked for: the view cannot tell, and "not in the cluster" would be a
                guess (a bug in the caller, never a state).
        """
        if name not in self.asked:
            raise LookupError(f"node {name} was not asked for in this Fleet view")
        return next((n for n in self.nodes if n.name == name), None)
