"""Ray Serve's application-level autoscaling policy, backed by our pure policies.

Serve instantiates the class once with `policy_kwargs` and calls it every controller
tick (0.1 s by default; 0.5 s on LocalServe's local clusters) with one AutoscalingContext
per autoscaled deployment. We translate the contexts into a ClusterView, ask the policy,
and return replica counts. Serve's own up/down delays should be 0: the policy damps itself.

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

The plan is re-published every `republish_s` even when unchanged: readers measure its age
from it (`wattwise_plan_age_seconds`), and a plan store Ray restarted after its node died
gets the newest plan within that time. The controller's gauges (ControllerMetrics) are
set from the first call, so a healthy system shows zeros rather than empty panels.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import ray
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingContext
from ray.util import metrics as ray_metrics

from app.cloud_load import view_load
from autoscaling.handover import EmptyingHandover
from autoscaling.registry import make_policy
from autoscaling.shadow_rollout import (
    SHADOW_KEY,
    RolloutEvent,
    ShadowRollouts,
    pools_from_entries,
)
from core.classes import LengthClassConfig
from core.plan import ClusterPlan
from core.published_plan import PublishedPlan
from core.stats import CLASS_FIELD_PREFIXES, ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.metrics import zero_counter
from deployments.plan_store import STORE_GONE, plan_store, plan_to_dict

logger = logging.getLogger("ray.serve")

# What Serve passes an application-level policy every tick, and what it returns: targets
# and policy state per deployment. Serve 2.60 exports AutoscalingContext publicly
# (ray.serve.config); DeploymentID and ReplicaID only from ray.serve._private.common,
# where its own policies (ray.serve.autoscaling_policy) import them from too.
Contexts = dict[DeploymentID, AutoscalingContext]


def view_from_contexts(ctxs: Contexts) -> ClusterView:
    deployments = {}
    for dep_id, ctx in ctxs.items():
        metrics = ctx.aggregated_metrics or {}
        by_replica: dict[ReplicaID, dict[str, float]] = {}
        for metric, values in metrics.items():
            for replica_id, value in values.items():
                by_replica.setdefault(replica_id, {})[metric] = value
        stats = tuple(ReplicaStats.from_metrics(m) for m in by_replica.values())
        known = set(ReplicaStats.__dataclass_fields__)
        extra: dict[str, float] = {}
        for metrics_of_replica in by_replica.values():
            for key, value in metrics_of_replica.items():
                if key not in known and not key.startswith(tuple(CLASS_FIELD_PREFIXES.values())):
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


def shadow_entries(ctxs: Contexts) -> dict[str, dict[str, Any]]:
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


ROLLOUT_OUTCOMES = ("completed", "abandoned", "cancelled", "retargeted")


class ControllerMetrics:
    """The controller-side gauges and counters; created only inside a Ray worker, and set
    at the first call (fail-static 0, counters at 0) so dashboards never show gaps."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self.fail_static = ray_metrics.Gauge(
            "wattwise_fail_static", "1 while the autoscaling policy fails static (keeps the last plan).",
            tag_keys=("application",))
        self.failures = ray_metrics.Counter(
            "wattwise_policy_failures_total", "Autoscaling policy failures by reason.",
            tag_keys=("application", "reason"))
        self.rollouts = ray_metrics.Counter(
            "wattwise_tp_rollouts_total", "Shadow TP rollouts by how they ended (completed, abandoned, "
            "cancelled, retargeted).", tag_keys=("application", "pool", "outcome"))
        self.plan_version = ray_metrics.Gauge(
            "wattwise_controller_plan_version", "Plans the controller has published since it started.",
            tag_keys=("application",))
        self.plan_age = ray_metrics.Gauge(
            "wattwise_controller_plan_age_seconds", "Seconds since the controller's plan last changed.",
            tag_keys=("application",))
        self.replicas = ray_metrics.Gauge(
            "wattwise_plan_replicas", "Replica target of each deployment in the controller's plan.",
            tag_keys=("application", "pool"))
        self.tensor_parallel = ray_metrics.Gauge(
            "wattwise_plan_tensor_parallel", "TP degree of each pool in the controller's plan.",
            tag_keys=("application", "pool"))
        self.clock_band = ray_metrics.Gauge(
            "wattwise_plan_clock_band_mhz", "Clock band (bound=low|high) the plan gives each pool's clock hook.",
            tag_keys=("application", "pool", "bound"))
        self.routing_weight = ray_metrics.Gauge(
            "wattwise_plan_routing_weight", "Share of a service class the plan routes to each pool.",
            tag_keys=("application", "service_class", "pool"))
        self.slo_guard = ray_metrics.Gauge(
            "wattwise_slo_guard_active", "1 while the plan's SLO guard has stopped saving for a length class (its "
            "SLO attainment fell below target), else 0.", tag_keys=("application", "length_class"))
        self.fail_static.set(0.0, self._tags())
        zero_counter(self.failures, self._tags(reason="stale_stats"))
        self._rollout_pools: set[str] = set()

    def _tags(self, **more: str) -> dict[str, str]:
        return {"application": self.app_name, **more}

    def record(self, reason: str | None) -> None:
        self.fail_static.set(1.0 if reason else 0.0, self._tags())
        if reason:
            self.failures.inc(1, self._tags(reason=reason))

    def rollout(self, event: RolloutEvent) -> None:
        self.rollouts.inc(1, self._tags(pool=event.pool, outcome=event.outcome))

    def plan(self, plan: ClusterPlan, version: int, age_s: float) -> None:
        """The decisions of the plan the controller holds, one gauge per field and pool."""
        for pool in plan.tensor_parallel.keys() - self._rollout_pools:  # rollout counters from 0
            for outcome in ROLLOUT_OUTCOMES:
                zero_counter(self.rollouts, self._tags(pool=pool, outcome=outcome))
            self._rollout_pools.add(pool)
        self.plan_version.set(version, self._tags())
        self.plan_age.set(age_s, self._tags())
        for pool, n in plan.replicas.items():
            self.replicas.set(n, self._tags(pool=pool))
        for pool, tp in plan.tensor_parallel.items():
            self.tensor_parallel.set(tp, self._tags(pool=pool))
        for pool, (low, high) in plan.clock_band_mhz.items():
            self.clock_band.set(low, self._tags(pool=pool, bound="low"))
            self.clock_band.set(high, self._tags(pool=pool, bound="high"))
        for service_class, weights in plan.routing_weights.items():
            for pool, weight in weights.items():
                self.routing_weight.set(weight, self._tags(service_class=service_class, pool=pool))
        for length_class in LengthClassConfig.names():  # every class, so a guard turned off reads 0
            self.slo_guard.set(float(length_class in plan.slo_guard), self._tags(length_class=length_class))


class AppAutoscalingPolicy:
    def __init__(self, policy: str = "utilisation", stale_after_s: float = 30.0, shadow_timeout_s: float = 600.0,
                 handover_s: float = 5.0, republish_s: float = 5.0, load_report_s: float = 1.0,
                 **policy_kwargs: Any) -> None:
        self.policy = make_policy(policy, **policy_kwargs)
        self.stale_after_s = stale_after_s
        # A shadow deployment not fully up this long after a TP change is given up.
        self.shadow_timeout_s = shadow_timeout_s
        self.rollouts = ShadowRollouts([], shadow_timeout_s)
        # A deployment the plan empties keeps its replicas this long, until the ingress has seen the plan.
        self.handover = EmptyingHandover(handover_s)
        # An unchanged plan is sent again this often (plan age, a restarted plan store).
        self.republish_s = republish_s
        # The replicas' work goes to the plan store this often, for GET /admin/load.
        self.load_report_s = load_report_s
        self._load_reported_s = float("-inf")
        self.pins = OperatorPins()
        self.failures = 0
        self.fail_static_reason: str | None = None
        self._published: tuple[PublishedPlan, dict[str, Any]] | None = None
        self._published_s = float("-inf")  # controller time of the last publish
        self._changed_s = 0.0  # controller time the published plan last changed
        self.plan_version = 0  # plans published that differed from the one before
        self._stats_seen_s: float | None = None
        self._metrics: ControllerMetrics | None = None
        self._store: Any = None
        self._last_publish: Future | None = None

    def _check_fresh(self, ctxs: Contexts, now: float) -> None:
        """Raise StaleStats when deployments run replicas but none reported any stats
        within the look-back window for `stale_after_s` (the metrics path is broken)."""
        running = [ctx for ctx in ctxs.values() if ctx.current_num_replicas > 0]
        if not running or any(ctx.aggregated_metrics for ctx in running) or self._stats_seen_s is None:
            self._stats_seen_s = now
            return
        if now - self._stats_seen_s > self.stale_after_s:
            raise StaleStats(f"no replica stats for {now - self._stats_seen_s:.0f} s")

    def _metrics_of(self, app_name: str | None) -> ControllerMetrics | None:
        if app_name is None or not ray.is_initialized():
            return None
        if self._metrics is None:
            self._metrics = ControllerMetrics(app_name)
        return self._metrics

    def _store_of(self, app_name: str | None) -> Any:
        if self._store is None and app_name is not None and ray.is_initialized():
            self._store = plan_store(app_name)
        return self._store

    def _report(self, app_name: str | None, reason: str | None) -> None:
        self.fail_static_reason = reason
        metrics = self._metrics_of(app_name)
        if metrics is not None:
            metrics.record(reason)

    def _publish(self, plan: PublishedPlan, app_name: str | None, now: float) -> None:
        """Hand TP, clocks, batch limits, routing and rollout state to the runtime (fire and
        forget): on a change, and every `republish_s` unchanged (plan age, store restarts)."""
        published = (plan, self.rollouts.report())
        if self._store_died():
            self._store = None  # Ray gave up restarting it: look it up again, which recreates it
        store = self._store_of(app_name)
        if store is None:
            return
        changed = published != self._published
        if changed:
            self.plan_version += 1
            self._changed_s = now
        if changed or now - self._published_s >= self.republish_s:
            self._last_publish = store.publish.remote(plan_to_dict(plan), published[1]).future()
            self._published, self._published_s = published, now
            metrics = self._metrics_of(app_name)
            if metrics is not None:
                metrics.plan(plan, self.plan_version, now - self._changed_s)

    def _store_died(self) -> bool:
        """Whether the last publish found the store dead for good (not restarting)."""
        last = self._last_publish
        if last is None or not last.done() or not isinstance(last.exception(), STORE_GONE):
            return False
        logger.warning("wattwise: the plan store died; looking it up again")
        self._last_publish = None
        return True

    def _shadow_rollouts(self, ctxs: Contexts) -> ShadowRollouts:
        """The rollout state machine for the app's shadow pools (new if they changed: a redeploy)."""
        pools = pools_from_entries(shadow_entries(ctxs))
        if list(self.rollouts.pools.values()) != pools:
            self.rollouts = ShadowRollouts(pools, self.shadow_timeout_s)
        return self.rollouts

    def _decide(self, ctxs: Contexts, now: float, app_name: str | None) -> dict[DeploymentID, int]:
        """The policy's plan on the logical view, with the operators' TP pins on top, turned
        into replica targets per deployment (shadow rollouts) and published."""
        rollouts = self._shadow_rollouts(ctxs)
        physical = view_from_contexts(ctxs)
        plan = self.policy.observe(rollouts.logical_view(physical), now)
        store = self._store_of(app_name)
        if store is not None and now - self._load_reported_s >= self.load_report_s:
            store.report_load.remote(view_load(physical, now))  # fire and forget: the next one replaces it
            self._load_reported_s = now
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
                metrics.rollout(event)
        published = replace(rollouts.published(plan, decision), running_replicas={
            name: d.current_replicas for name, d in physical.deployments.items()})
        self._publish(published, app_name, now)
        previous = {dep_id.name: ctx.target_num_replicas for dep_id, ctx in ctxs.items()}
        targets = self.handover.hold({name: published.replicas.get(name, n) for name, n in previous.items()},
                                     previous, now)
        return {dep_id: targets[dep_id.name] for dep_id in ctxs}

    def __call__(self, ctxs: Contexts) -> tuple[dict[DeploymentID, int], dict[DeploymentID, dict[str, Any]]]:
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
        if reason != self.fail_static_reason or reason or self._metrics is None:
            self._report(app_name, reason)
        state = {"policy_failures": self.failures, "fail_static": reason is not None, "fail_static_reason": reason}
        return decisions, {dep_id: dict(state) for dep_id in ctxs}
