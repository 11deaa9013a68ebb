"""Where the controller publishes the ClusterPlan and the runtime picks it up.

Serve's autoscaling policy returns only replica counts; the rest of a plan (TP,
clocks, batch limits, routing weights, which deployment serves each shadow-TP pool)
goes to this named actor, which replicas and the ingress poll. A missing or stale plan
leaves them serving as they were. Operators' settings live here too, so every ingress
and replica sees the same and they outlive restarts: clock pins and drained pools are
layered over each plan; TP pins are applied by the controller (a pool's TP may mean a
shadow rollout, never a replica re-sharding).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import ray

from core.plan import ClusterPlan

NAMESPACE = "wattwise"
# Override fields the controller applies to its plan instead of the store layering them.
CONTROLLER_FIELDS = frozenset({"tensor_parallel"})
logger = logging.getLogger("ray.serve")


@ray.remote(num_cpus=0)
class PlanStore:
    def __init__(self) -> None:
        self.version = 0
        self.plan: dict[str, Any] | None = None
        # An operator's settings (POST /admin/clocks, /admin/tensor_parallel, /admin/drain):
        # plan field -> {deployment: value}, layered over every published plan until cleared.
        self.overrides: dict[str, dict[str, Any]] = {}
        # The controller's shadow TP rollouts per pool (autoscaling.shadow_rollout.report).
        self.rollouts: dict[str, Any] = {}

    def publish(self, plan: dict[str, Any], rollouts: dict[str, Any] | None = None) -> int:
        if plan != self.plan:
            self.plan = plan
            self.version += 1
        if rollouts is not None:
            self.rollouts = rollouts
        return self.version

    def overrides_of(self, field: str) -> dict[str, Any]:
        """The operators' settings of one plan field: {deployment: value}."""
        return dict(self.overrides.get(field, {}))

    def override(self, field: str, deployment: str, value: Any | None) -> int:
        """Pin `field` (e.g. clock_mhz) of one deployment; None removes the pin."""
        layer = self.overrides.setdefault(field, {})
        if value is None:
            layer.pop(deployment, None)
        else:
            layer[deployment] = value
        self.version += 1
        return self.version

    def effective(self) -> dict[str, Any] | None:
        """The published plan with the operator's overrides on top."""
        layers = {field: layer for field, layer in self.overrides.items() if layer and field not in CONTROLLER_FIELDS}
        if not layers:
            return self.plan
        plan = dict(self.plan or {})
        for field, layer in layers.items():
            plan[field] = {**plan.get(field, {}), **layer}
        return plan

    def get(self, known_version: int = -1) -> tuple[int, dict[str, Any] | None]:
        """The plan if newer than `known_version` (else None, to keep replies small)."""
        return self.version, (self.effective() if self.version != known_version else None)

    def admin_view(self) -> dict[str, Any]:
        return {"version": self.version, "plan": self.plan, "overrides": self.overrides, "rollouts": self.rollouts}


def plan_store(app_name: str):
    return PlanStore.options(
        name=f"plan-{app_name}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


def plan_to_dict(plan: ClusterPlan) -> dict[str, Any]:
    return asdict(plan)


def plan_from_dict(data: dict[str, Any]) -> ClusterPlan:
    return ClusterPlan(**data)


async def follow_plan(app_name: str, apply: Callable[[ClusterPlan], None], period_s: float = 1.0) -> None:
    """Poll the store forever, calling `apply` with each new plan."""
    store = plan_store(app_name)
    version = -1
    while True:
        try:
            version, data = await store.get.remote(version)
            if data is not None:
                apply(plan_from_dict(data))
        except Exception:  # the replica keeps serving on the last plan it had
            logger.exception("wattwise: reading the plan failed; keeping the last one")
        await asyncio.sleep(period_s)
