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

Pools whose TP changes run as shadow deployments (autoscaling.shadow_rollout) are shown
to the policy as one logical deployment; their rollouts turn its plan into targets per
deployment, and `wattwise_tp_rollouts_total` counts how rollouts ended. An operator's TP
pins (POST /admin/tensor_parallel) are read from the plan store and win over the policy.
A deployment the plan empties keeps its replicas `handover_s` longer (autoscaling.handover),
until the ingress has read the plan that routes its traffic elsewhere.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from autoscaling.handover import EmptyingHandover
from autoscaling.registry import make_policy
from autoscaling.shadow_rollout import (
    SHADOW_KEY,
    RolloutEvent,
    ShadowRollouts,
    pools_from_entries,
)
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


def shadow_entries(ctxs: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    """{deployment: its place in a shadow pool} from each deployment's autoscaling config."""
    entries = {}
    for dep_id, ctx in ctxs.items():
        policy = getattr(ctx.config, "policy", None)
        entry = (getattr(policy, "policy_kwargs", None) or {}).get(SHADOW_KEY)
        if entry:
            entries[dep_id.name] = entry
    return entries


class OperatorPins:
    """The operators' TP pins from the plan store, read without blocking the controller:
    one read in flight at a time, its answer taken on a later tick."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.pins: dict[str, int] = {}
        self._pending: Future | None = None
        self._asked_s = float("-inf")

    def poll(self, store: Any, now_s: float) -> dict[str, int]:
        if self._pending is not None and self._pending.done():
            try:
                self.pins = self._pending.result()
            except Exception:  # keep the last pins; the next read may succeed
                logger.exception("wattwise: reading operator TP pins failed")
            self._pending = None
        if self._pending is None and now_s - self._asked_s >= self.period_s:
            self._pending = store.overrides_of.remote("tensor_parallel").future()
            self._asked_s = now_s
        return self.pins


class FailStaticMetrics:
    """The controller-side gauges and counters; created only inside a Ray worker."""

    def __init__(self) -> None:
        self.fail_static = ray_metrics.Gauge(
            "wattwise_fail_static", "1 while the autoscaling policy fails static (keeps the last plan).",
            tag_keys=("application",))
        self.failures = ray_metrics.Counter(
            "wattwise_policy_failures_total", "Autoscaling policy failures by reason.",
            tag_keys=("application", "reason"))
        self.rollouts = ray_metrics.Counter(
            "wattwise_tp_rollouts_total", "Shadow TP rollouts by how they ended (completed, abandoned, "
            "cancelled, retargeted).", tag_keys=("application", "pool", "outcome"))

    def record(self, app_name: str, reason: str | None) -> None:
        self.fail_static.set(1.0 if reason else 0.0, {"application": app_name})
        if reason:
            self.failures.inc(1, {"application": app_name, "reason": reason})

    def rollout(self, app_name: str, event: RolloutEvent) -> None:
        self.rollouts.inc(1, {"application": app_name, "pool": event.pool, "outcome": event.outcome})


class AppAutoscalingPolicy:
    def __init__(self, policy: str = "utilisation", stale_after_s: float = 30.0, shadow_timeout_s: float = 600.0,
                 handover_s: float = 5.0, **policy_kwargs: Any) -> None:
        self.policy = make_policy(policy, **policy_kwargs)
        self.stale_after_s = stale_after_s
        # A shadow deployment not fully up this long after a TP change is given up.
        self.shadow_timeout_s = shadow_timeout_s
        self.rollouts = ShadowRollouts([], shadow_timeout_s)
        # A deployment the plan empties keeps its replicas this long, until the ingress has seen the plan.
        self.handover = EmptyingHandover(handover_s)
        self.pins = OperatorPins()
        self.failures = 0
        self.fail_static_reason: str | None = None
        self._published: tuple[ClusterPlan, dict[str, Any]] | None = None
        self._stats_seen_s: float | None = None
        self._metrics: FailStaticMetrics | None = None
        self._store: Any = None

    def _check_fresh(self, ctxs: dict[Any, Any], now: float) -> None:
        """Raise StaleStats when deployments run replicas but none reported any stats
        within the look-back window for `stale_after_s` (the metrics path is broken)."""
        running = [ctx for ctx in ctxs.values() if ctx.current_num_replicas > 0]
        if not running or any(ctx.aggregated_metrics for ctx in running) or self._stats_seen_s is None:
            self._stats_seen_s = now
            return
        if now - self._stats_seen_s > self.stale_after_s:
            raise StaleStats(f"no replica stats for {now - self._stats_seen_s:.0f} s")

    def _metrics_of(self, app_name: str | None) -> FailStaticMetrics | None:
        if app_name is None or not ray.is_initialized():
            return None
        if self._metrics is None:
            self._metrics = FailStaticMetrics()
        return self._metrics

    def _store_of(self, app_name: str | None) -> Any:
        if app_name is None or not ray.is_initialized():
            return None
        if self._store is None:
            self._store = plan_store(app_name)
        return self._store

    def _report(self, app_name: str | None, reason: str | None) -> None:
        self.fail_static_reason = reason
        metrics = self._metrics_of(app_name)
        if metrics is not None:
            metrics.record(app_name, reason)

    def _publish(self, plan: ClusterPlan, app_name: str | None) -> None:
        """Hand TP, clocks, batch limits, routing and rollout state to the runtime (fire and forget)."""
        published = (plan, self.rollouts.report())
        store = self._store_of(app_name)
        if published == self._published or store is None:
            return
        store.publish.remote(plan_to_dict(plan), published[1])
        self._published = published

    def _shadow_rollouts(self, ctxs: dict[Any, Any]) -> ShadowRollouts:
        """The rollout state machine for the app's shadow pools (new if they changed: a redeploy)."""
        pools = pools_from_entries(shadow_entries(ctxs))
        if list(self.rollouts.pools.values()) != pools:
            self.rollouts = ShadowRollouts(pools, self.shadow_timeout_s)
        return self.rollouts

    def _decide(self, ctxs: dict[Any, Any], now: float, app_name: str | None) -> dict[Any, int]:
        """The policy's plan on the logical view, with the operators' TP pins on top, turned
        into replica targets per deployment (shadow rollouts) and published."""
        rollouts = self._shadow_rollouts(ctxs)
        physical = view_from_contexts(ctxs)
        plan = self.policy.observe(rollouts.logical_view(physical), now)
        store = self._store_of(app_name)
        pins = self.pins.poll(store, now) if store is not None else {}
        if pins:
            plan = replace(plan, tensor_parallel={**plan.tensor_parallel, **pins})
        decision = rollouts.step(plan, physical, now)
        for event in decision.events:
            log = logger.warning if event.outcome == "abandoned" else logger.info
            log("wattwise: TP rollout of %s TP%d -> TP%d %s after %.1f s", event.pool, event.from_tp, event.to_tp,
                event.outcome, event.after_s)
            metrics = self._metrics_of(app_name)
            if metrics is not None:
                metrics.rollout(app_name, event)
        published = rollouts.published(plan, decision)
        self._publish(published, app_name)
        previous = {dep_id.name: ctx.target_num_replicas for dep_id, ctx in ctxs.items()}
        targets = self.handover.hold({name: published.replicas.get(name, n) for name, n in previous.items()},
                                     previous, now)
        return {dep_id: targets[dep_id.name] for dep_id in ctxs}

    def __call__(self, ctxs: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        now = max((ctx.current_time or 0.0) for ctx in ctxs.values()) if ctxs else 0.0
        app_name = next(iter(ctxs.values())).app_name if ctxs else None
        try:
            self._check_fresh(ctxs, now)
            decisions = self._decide(ctxs, now, app_name)
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
