"""A utilisation autoscaler in the style of Llumnix: keep each pool's load in a band.

Load per replica is the larger of (requests on it / target requests) and its KV cache
use. Above the band the pool grows at once to bring load back to the middle; below
it the pool shrinks only after the load stayed low for `downscale_hold_s`, so a
lull between bursts does not cost a cold start.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.plan import ClusterPlan
from core.view import ClusterView, DeploymentView


class UtilisationConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target_requests_per_replica: float = Field(default=16.0, gt=0, description=(
        "Requests on a replica that count as full load (1.0); a replica's load is the larger of its "
        "requests over this and its KV cache use."))
    scale_up_above: float = Field(default=0.8, gt=0, description=(
        "Upper edge of the load band: above it the pool grows at once to bring load back to the middle."))
    scale_down_below: float = Field(default=0.3, ge=0, description=(
        "Lower edge of the load band (< scale_up_above): below it for downscale_hold_s the pool "
        "shrinks toward the middle."))
    downscale_hold_s: float = Field(default=30.0, ge=0, description=(
        "The pool shrinks only after its load stayed below the band this long (s), so a lull between "
        "bursts does not cost a cold start."))

    @model_validator(mode="after")
    def _band(self) -> UtilisationConfig:
        if self.scale_down_below >= self.scale_up_above:
            raise ValueError("scale_down_below must be < scale_up_above")
        return self


class UtilisationPolicy:
    def __init__(self, config: UtilisationConfig = UtilisationConfig()) -> None:
        self.config = config
        self._low_since: dict[str, float] = {}

    def utilisation(self, dep: DeploymentView) -> float:
        """Mean load of the pool's replicas as a share of their capacity."""
        if dep.current_replicas == 0:
            return math.inf if dep.total_load > 0 else 0.0
        by_requests = dep.total_load / (dep.current_replicas * self.config.target_requests_per_replica)
        by_kv = max((s.kv_utilisation for s in dep.replica_stats), default=0.0)
        return max(by_requests, by_kv)

    def desired_replicas(self, dep: DeploymentView, now_s: float) -> int:
        cfg = self.config
        util = self.utilisation(dep)
        middle = (cfg.scale_up_above + cfg.scale_down_below) / 2
        current = dep.current_replicas
        desired = current
        if util > cfg.scale_up_above:
            self._low_since.pop(dep.name, None)
            if current == 0:
                desired = max(1, math.ceil(dep.total_load / (cfg.target_requests_per_replica * middle)))
            else:
                desired = math.ceil(current * util / middle)
        elif util < cfg.scale_down_below:
            since = self._low_since.setdefault(dep.name, now_s)
            if now_s - since >= cfg.downscale_hold_s:
                desired = max(math.ceil(current * util / middle), 0 if dep.total_load == 0 else 1)
                self._low_since.pop(dep.name, None)
        else:
            self._low_since.pop(dep.name, None)
        return min(max(desired, dep.min_replicas), dep.max_replicas)

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        replicas = {name: self.desired_replicas(dep, now_s) for name, dep in view.deployments.items()}
        return ClusterPlan(replicas=replicas, reason="utilisation")
