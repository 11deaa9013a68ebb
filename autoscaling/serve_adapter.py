"""Ray Serve's application-level autoscaling policy, backed by our pure policies.

Serve instantiates the class once with `policy_kwargs` and calls it every controller
tick (~0.1 s) with one AutoscalingContext per autoscaled deployment. We translate the
contexts into a ClusterView, ask the policy, and return replica counts. Serve's own
up/down delays should be 0: the policy damps itself.

Fail static: if the policy raises (a bug, a solver timeout surfacing as an error) or
no replica has reported stats for `stale_after_s`, we keep the current targets and
publish no new plan, so replicas go on serving with the last plan. The gauge
`wattwise_fail_static` (1 while failing static) and `wattwise_policy_failures_total`
(by reason) make it visible; the returned policy state carries the same.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from autoscaling.registry import make_policy
from core.plan import ClusterPlan
from core.stats import RATE_PREFIX, ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.plan_store import plan_store, plan_to_dict

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


class StaleStats(RuntimeError):
    """No replica has reported stats for too long: deciding on them would be guessing."""


class FailStaticMetrics:
    """The controller-side gauge and counter; created only inside a Ray worker."""

    def __init__(self) -> None:
        self.fail_static = ray_metrics.Gauge(
            "wattwise_fail_static", "1 while the autoscaling policy fails static (keeps the last plan).",
            tag_keys=("application",))
        self.failures = ray_metrics.Counter(
            "wattwise_policy_failures_total", "Autoscaling policy failures by reason.",
            tag_keys=("application", "reason"))

    def record(self, app_name: str, reason: str | None) -> None:
        self.fail_static.set(1.0 if reason else 0.0, {"application": app_name})
        if reason:
            self.failures.inc(1, {"application": app_name, "reason": reason})


class AppAutoscalingPolicy:
    def __init__(self, policy: str = "utilisation", stale_after_s: float = 30.0, **policy_kwargs: Any) -> None:
        self.policy = make_policy(policy, **policy_kwargs)
        self.stale_after_s = stale_after_s
        self.failures = 0
        self.fail_static_reason: str | None = None
        self._published: ClusterPlan | None = None
        self._stats_seen_s: float | None = None
        self._metrics: FailStaticMetrics | None = None

    def _check_fresh(self, ctxs: dict[Any, Any], now: float) -> None:
        """Raise StaleStats when deployments run replicas but none reported any stats
        within the look-back window for `stale_after_s` (the metrics path is broken)."""
        running = [ctx for ctx in ctxs.values() if ctx.current_num_replicas > 0]
        if not running or any(ctx.aggregated_metrics for ctx in running) or self._stats_seen_s is None:
            self._stats_seen_s = now
            return
        if now - self._stats_seen_s > self.stale_after_s:
            raise StaleStats(f"no replica stats for {now - self._stats_seen_s:.0f} s")

    def _report(self, app_name: str | None, reason: str | None) -> None:
        self.fail_static_reason = reason
        if app_name is None or not ray.is_initialized():
            return
        if self._metrics is None:
            self._metrics = FailStaticMetrics()
        self._metrics.record(app_name, reason)

    def _publish(self, plan: ClusterPlan, app_name: str | None) -> None:
        """Hand TP, clocks, batch limits and routing to the runtime (fire and forget)."""
        if plan == self._published or app_name is None or not ray.is_initialized():
            return
        plan_store(app_name).publish.remote(plan_to_dict(plan))
        self._published = plan

    def __call__(self, ctxs: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        now = max((ctx.current_time or 0.0) for ctx in ctxs.values()) if ctxs else 0.0
        app_name = next(iter(ctxs.values())).app_name if ctxs else None
        try:
            self._check_fresh(ctxs, now)
            plan = self.policy.observe(view_from_contexts(ctxs), now)
            decisions = {dep_id: plan.replicas.get(dep_id.name, ctx.target_num_replicas) for dep_id, ctx in ctxs.items()}
            self._publish(plan, app_name)
            reason = None
        except Exception as exc:
            self.failures += 1
            reason = "stale_stats" if isinstance(exc, StaleStats) else type(exc).__name__
            logger.exception("wattwise autoscaling policy failed (%d); keeping current targets", self.failures)
            decisions = {dep_id: ctx.target_num_replicas for dep_id, ctx in ctxs.items()}
        if reason != self.fail_static_reason or reason:
            self._report(app_name, reason)
        state = {"policy_failures": self.failures, "fail_static": reason is not None, "fail_static_reason": reason}
        return decisions, {dep_id: dict(state) for dep_id in ctxs}
