"""Cluster manager (DynamoLLM §IV-B, scale-out/in): instances per pool, spill routing.

Each pool is sized for its predicted peak with every instance at the
highest-performance configuration (TP8, max clock). Demand is counted in instances:
a class with predicted peak PL and per-instance capacity ML needs PL/ML. A pool gets
floor(demand) instances and spills the fraction left over to the next larger pool,
so only the largest pool may be over-provisioned; a pool whose demand is below
`min_pool_instances` gets none and spills it all (fragmentation). With `max_pools`
set, only the busiest pools keep instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolDemand:
    """A pool in size order (smallest requests first) and its demand in instances."""

    name: str
    instances_needed: float


@dataclass(frozen=True)
class ClusterDecision:
    instances: dict[str, int]
    # pool -> share of its own traffic it keeps; the rest goes to `spill_to[pool]`.
    keep_share: dict[str, float]
    spill_to: dict[str, str]


def size_pools(
    pools: list[PoolDemand],
    gpus_available: int,
    gpus_per_instance: int = 8,
    min_pool_instances: float = 0.5,
    max_pools: int | None = None,
) -> ClusterDecision:
    keep_names = {p.name for p in pools}
    if max_pools is not None and max_pools < len(pools):
        busiest = sorted(pools, key=lambda p: p.instances_needed, reverse=True)[:max_pools]
        keep_names = {p.name for p in busiest} | {pools[-1].name}
    instances: dict[str, int] = {}
    keep: dict[str, float] = {}
    spill_to: dict[str, str] = {}
    carried = 0.0
    for i, pool in enumerate(pools):
        demand = pool.instances_needed + carried
        last = i == len(pools) - 1
        if last:
            n = math.ceil(demand - 1e-9) if demand > 0 else 0
        elif pool.name not in keep_names or demand < min_pool_instances:
            n = 0
        else:
            n = math.floor(demand)
        instances[pool.name] = n
        leftover = max(demand - n, 0.0) if not last else 0.0
        # Share of this pool's own arrivals forwarded: the leftover, capped at its own traffic.
        own = pool.instances_needed
        keep[pool.name] = 1.0 if own <= 0 else max(0.0, 1.0 - min(leftover, own) / own)
        if not last:
            spill_to[pool.name] = pools[i + 1].name
        carried = leftover
    # Trim from the largest pools down if the plan exceeds the cluster (lowest priority last).
    budget = gpus_available // gpus_per_instance
    for pool in reversed(pools):
        over = sum(instances.values()) - budget
        if over <= 0:
            break
        cut = min(over, max(instances[pool.name] - 1, 0))
        instances[pool.name] -= cut
    return ClusterDecision(instances, keep, spill_to)
