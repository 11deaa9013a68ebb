"""What a controller sees of the cluster at one instant."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.stats import ReplicaStats


@dataclass(frozen=True)
class DeploymentView:
    """One deployment (pool) with its replicas' latest stats."""

    name: str
    current_replicas: int
    target_replicas: int
    min_replicas: int
    max_replicas: int
    replica_stats: tuple[ReplicaStats, ...] = ()
    # Requests held outside replicas (router / handle queues), as Serve reports them.
    queued_outside: float = 0.0
    # Metrics a deployment reports beyond ReplicaStats (e.g. the batch queue's groups).
    extra_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def total_load(self) -> float:
        return sum(s.load for s in self.replica_stats) + self.queued_outside


@dataclass(frozen=True)
class ClusterView:
    deployments: dict[str, DeploymentView] = field(default_factory=dict)
