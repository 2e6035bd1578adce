"""CLI commands about nodes: ``rebound gpus NODE``."""

from __future__ import annotations

from activities.temporal.rebound_workflows import read_node_gpu_health
from workers.client import connect
from workers.console import EXIT_FAIL, EXIT_OK, print_json
from workers.settings import Settings
from workflows.domain.gpu import NodeGpuHealthResult


async def read_node_gpus(settings: Settings, node: str) -> NodeGpuHealthResult:
    """Run one NodeGpuHealth workflow and wait for it (about a second when the agent is up)."""
    client = await connect(settings.temporal)
    return await read_node_gpu_health(client, settings.cluster_name, node, task_queue=settings.temporal.task_queue)


async def gpus(settings: Settings, node: str, *, as_json: bool) -> int:
    res = await read_node_gpus(settings, node)
    if as_json:
        print_json(res.model_dump(mode="json"))
        return EXIT_OK if res.agent_reachable else EXIT_FAIL
    if not res.agent_reachable or res.report is None:
        print(f"{node}: {res.error}")
        return EXIT_FAIL
    rep = res.report
    if rep.error:
        print(f"{node}: GPUs unreadable: {rep.error}")
        return EXIT_FAIL
    print(f"{node}: driver {rep.driver_version}, {len(rep.samples)} GPUs")
    for s in rep.samples:
        state = "LOST" if s.lost else f"{s.temperature_c}C util {s.utilization_gpu_pct}%"
        print(f"  gpu{s.index} {s.uuid} {s.pci_bus_id} {state} ecc_uncorrected={s.ecc_uncorrected_volatile}")
    for e in rep.events:
        print(f"  event {e.kind.value} gpu{e.index} xid={e.xid}")
    return EXIT_OK
