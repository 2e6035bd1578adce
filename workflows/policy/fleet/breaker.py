"""The Fleet's breaker: at most ``cap`` drains by Rebound per sliding window, for the cluster and for each
partition; an operator's reset starts the count again. Pure.

Cluster cap: ``max(1, min(breaker_max_nodes, floor(breaker_max_fraction x nodes)))``; partition cap:
``max(1, floor(breaker_max_fraction x partition nodes))``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from workflows.domain.fleet import BreakerStatus, DrainEvent, FleetPolicy, FleetState
from workflows.domain.fleet_view import FleetView
from workflows.domain.progress import aware
from workflows.domain.slurm import SlurmNode
from workflows.policy.fleet.common import span, within

__all__ = ["BREAKER_HOLD", "apply_breaker", "breaker_status"]

#: In every reason of a drain the breaker holds (``<node>: breaker: ... cap ... reached``): how an approval tells
#: a drain held by the cap (a storm) from one held by a rule (one user's claims, low confidence).
BREAKER_HOLD = ": breaker: "

#: Added before flooring a cap: 0.29 x 100 is 28.999999999999996 in floating point, and must allow 29.
_FLOOR_EPSILON = 1e-9


def _floor_share(fraction: float, count: int) -> int:
    return math.floor(fraction * max(count, 0) + _FLOOR_EPSILON)


def _cluster_cap(policy: FleetPolicy, cluster_nodes: int) -> int:
    return max(1, min(policy.breaker_max_nodes, _floor_share(policy.breaker_max_fraction, cluster_nodes)))


def _partition_cap(policy: FleetPolicy, partition_nodes: int) -> int:
    return max(1, _floor_share(policy.breaker_max_fraction, partition_nodes))


def _counted_drains(state: FleetState, policy: FleetPolicy, now: datetime) -> list[DrainEvent]:
    """Drains inside the window; once an operator reset the breaker, only those since the reset."""
    reset = state.breaker_reset_at
    return [
        d
        for d in state.drains
        if within(d.at, now, policy.breaker_window_s) and (reset is None or aware(d.at) >= aware(reset))
    ]


def breaker_status(state: FleetState, policy: FleetPolicy, cluster_nodes: int, now: datetime) -> BreakerStatus:
    """Drains by Rebound in the sliding window against the cluster's cap; open (no more drains) at the cap."""
    drained = len(_counted_drains(state, policy, now))
    cap = _cluster_cap(policy, cluster_nodes)
    return BreakerStatus(drained_in_window=drained, cap=cap, open=drained >= cap, reset_at=state.breaker_reset_at)


def apply_breaker(
    state: FleetState,
    policy: FleetPolicy,
    view: FleetView,
    now: datetime,
    to_drain: Sequence[SlurmNode],
    hold: list[str],
    reasons: list[str],
) -> list[str]:
    """The nodes the breaker lets through, in order; the rest go to ``hold`` with the cap they hit."""
    counted = _counted_drains(state, policy, now)
    cap = _cluster_cap(policy, view.node_count)
    used = len(counted)
    part_size = Counter(view.partition_sizes)
    part_used = Counter(p for d in counted for p in set(d.partitions))
    window = span(policy.breaker_window_s)
    drain: list[str] = []
    for node in to_drain:
        if used >= cap:
            hold.append(node.name)
            reasons.append(
                f"{node.name}{BREAKER_HOLD}cluster cap {cap} reached ({used} drains in the last {window}; cap = "
                f"max(1, min({policy.breaker_max_nodes}, {policy.breaker_max_fraction:g} x {view.node_count} nodes)))"
            )
            continue
        parts = sorted(set(node.partitions))
        full = [p for p in parts if part_used[p] >= _partition_cap(policy, part_size[p])]
        if full:
            p = full[0]
            hold.append(node.name)
            reasons.append(
                f"{node.name}{BREAKER_HOLD}partition {p!r} cap {_partition_cap(policy, part_size[p])} reached "
                f"({part_used[p]} drains in the last {window}; cap = max(1, {policy.breaker_max_fraction:g} x "
                f"{part_size[p]} nodes))"
            )
            continue
        drain.append(node.name)
        used += 1
        part_used.update(parts)
    return drain
