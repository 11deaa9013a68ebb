"""Ray Serve's application-level autoscaling policy, backed by our pure policies.

Serve instantiates the class once with `policy_kwargs` and calls it every controller
tick (~0.1 s) with one AutoscalingContext per autoscaled deployment. We translate the
contexts into a ClusterView, ask the policy, and return replica counts. Serve's own
up/down delays should be 0: the policy damps itself. If the policy raises, we keep
the current targets (fail static) and count the failure.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from autoscaling.registry import make_policy
from core.plan import ClusterPlan
from deployments.plan_store import plan_store, plan_to_dict
from core.stats import RATE_PREFIX, ReplicaStats
from core.view import ClusterView, DeploymentView

logger = logging.getLogger("ray.serve")


def view_from_contexts(ctxs: dict[Any, Any]) -> ClusterView:
    deployments = {}
    for dep_id, ctx in ctxs.items():
        metrics = ctx.aggregated_metrics or {}
        by_replica: dict[Any, dict[str, float]] = {}
        for metric, values in metrics.items():
            for replica_id, value in values.items():
                by_replica.setdefault(replica_id, {})[metric] = value
        stats = tuple(ReplicaStats.from_metrics(m) for m in by_replica.values())
        known = set(ReplicaStats.__dataclass_fields__)
        extra: dict[str, float] = {}
        for metrics_of_replica in by_replica.values():
            for key, value in metrics_of_replica.items():
                if key not in known and not key.startswith(RATE_PREFIX):
                    extra[key] = extra.get(key, 0.0) + value
        reported = sum(s.load for s in stats)
        deployments[dep_id.name] = DeploymentView(
            name=dep_id.name,
            current_replicas=ctx.current_num_replicas,
            target_replicas=ctx.target_num_replicas,
            min_replicas=ctx.capacity_adjusted_min_replicas,
            max_replicas=ctx.capacity_adjusted_max_replicas,
            replica_stats=stats,
            # Requests Serve counts that our replicas have not reported yet (router queues).
            queued_outside=max(float(ctx.total_num_requests) - reported, 0.0),
            extra_metrics=extra,
        )
    return ClusterView(deployments)


class AppAutoscalingPolicy:
    def __init__(self, policy: str = "utilisation", **policy_kwargs: Any) -> None:
        self.policy = make_policy(policy, **policy_kwargs)
        self.failures = 0
        self._published: ClusterPlan | None = None

    def _publish(self, plan: ClusterPlan, app_name: str | None) -> None:
        """Hand TP, clocks, batch limits and routing to the runtime (fire and forget)."""
        if plan == self._published or app_name is None or not ray.is_initialized():
            return
        plan_store(app_name).publish.remote(plan_to_dict(plan))
        self._published = plan

    def __call__(self, ctxs: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        now = max((ctx.current_time or 0.0) for ctx in ctxs.values()) if ctxs else 0.0
        try:
            plan = self.policy.observe(view_from_contexts(ctxs), now)
            decisions = {dep_id: plan.replicas.get(dep_id.name, ctx.target_num_replicas) for dep_id, ctx in ctxs.items()}
            self._publish(plan, next(iter(ctxs.values())).app_name if ctxs else None)
        except Exception:
            self.failures += 1
            logger.exception("wattwise autoscaling policy failed (%d); keeping current targets", self.failures)
            decisions = {dep_id: ctx.target_num_replicas for dep_id, ctx in ctxs.items()}
        return decisions, {dep_id: {"policy_failures": self.failures} for dep_id in ctxs}
