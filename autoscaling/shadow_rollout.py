"""Tensor-parallel changes as shadow deployments: the new TP starts beside the old one.

vLLM cannot re-shard a running engine, and restarting serving replicas at a new TP would
take their capacity (and in-flight requests) away for as long as an engine loads. So a
pool that changes TP this way has one Serve deployment per TP it may run at, and a change
is a rollout: the new TP's deployment scales up to the planned replicas while the old one
keeps serving at its count; once every new replica runs and reports stats, the pool's
traffic switches to it and the old deployment goes to 0 (after the adapter's handover,
autoscaling.handover; Serve then drains it: in-flight requests finish). A shadow not up
within `timeout_s` is abandoned (old keeps serving; the same TP is not retried for
`retry_after_s`). throttLL'eM's shadow instances (throttLL'eM paper §IV-D) work this way. The
simulator does the same per replica (sim.simulator's reconcile: old-TP replicas serve until
new ones are ready; new ones cost DynamoLLM's re-shard time), so a policy's TP change has
the same effect in both runtimes.

Policies stay unaware of all this: they see one logical deployment per pool and plan it
(replicas, TP); this module maps that plan onto the physical deployments. Pure: Serve's
view and the time come in, replica targets and the plan to publish go out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from core.plan import ClusterPlan
from core.published_plan import PublishedPlan
from core.view import ClusterView, DeploymentView

# The key under which each physical deployment of a shadow pool carries its place in the
# pool (autoscaling_config.policy.policy_kwargs, which Serve ignores for its default
# policy function but hands to the application-level policy in every context).
SHADOW_KEY = "wattwise_shadow"


@dataclass(frozen=True)
class ShadowPool:
    """A pool whose TP changes are deployments: `deployments` maps each TP to its own."""

    name: str
    deployments: dict[int, str]
    min_replicas: int = 1
    max_replicas: int = 4

    def entry(self, tp: int) -> dict[str, Any]:
        """What deployment `deployments[tp]` carries under SHADOW_KEY."""
        return {"pool": self.name, "tensor_parallel": tp, "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas}


def pools_from_entries(entries: Mapping[str, Mapping[str, Any]]) -> list[ShadowPool]:
    """Shadow pools from {deployment: its SHADOW_KEY entry}, in first-seen order."""
    grouped: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for deployment, entry in entries.items():
        grouped.setdefault(entry["pool"], []).append((deployment, entry))
    return [
        ShadowPool(name, {int(e["tensor_parallel"]): dep for dep, e in members},
                   int(members[0][1]["min_replicas"]), int(members[0][1]["max_replicas"]))
        for name, members in grouped.items()
    ]


@dataclass(frozen=True)
class Rollout:
    from_tp: int
    to_tp: int
    started_s: float
    # The serving deployment's replicas when the rollout began: kept until the switch, so
    # capacity never drops below it while the shadow comes up.
    old_replicas: int


@dataclass(frozen=True)
class RolloutEvent:
    """A rollout that ended: completed, abandoned (timeout), cancelled (the plan went back
    to the serving TP) or retargeted (the plan moved on to a third TP)."""

    pool: str
    from_tp: int
    to_tp: int
    outcome: str
    after_s: float


@dataclass
class _PoolState:
    serving_tp: int
    replicas: int
    rollout: Rollout | None = None
    held: tuple[int, float] | None = None  # (TP abandoned, not retried before this time)
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class RolloutDecision:
    targets: dict[str, int]  # physical deployment -> replicas
    serving: dict[str, str]  # pool -> the deployment taking its traffic
    events: tuple[RolloutEvent, ...] = ()


_ABSENT = DeploymentView("", 0, 0, 0, 0)


def _dep(view: ClusterView, name: str) -> DeploymentView:
    return view.deployments.get(name, _ABSENT)


class ShadowRollouts:
    def __init__(self, pools: Iterable[ShadowPool], timeout_s: float = 600.0, retry_after_s: float | None = None):
        self.pools = {p.name: p for p in pools}
        self.timeout_s = timeout_s
        self.retry_after_s = timeout_s if retry_after_s is None else retry_after_s
        self._owner = {dep: p.name for p in self.pools.values() for dep in p.deployments.values()}
        self._state: dict[str, _PoolState] = {}

    def _state_of(self, pool: ShadowPool, view: ClusterView) -> _PoolState:
        """A pool's state; first seen (or after a controller restart) the deployment with
        the most replicas serves, the primary (the pool's own name) on a tie."""
        state = self._state.get(pool.name)
        if state is None:
            targets = {tp: _dep(view, name).target_replicas for tp, name in pool.deployments.items()}
            serving = max(targets, key=lambda tp: (targets[tp], pool.deployments[tp] == pool.name))
            state = self._state[pool.name] = _PoolState(serving, targets[serving])
        return state

    def logical_view(self, view: ClusterView) -> ClusterView:
        """One deployment per pool, as the policy knows it: the serving deployment's
        replicas and the stats of every replica of the pool (load is load wherever it
        runs, draining replicas included); the pool's own bounds."""
        out: dict[str, DeploymentView] = {}
        for name, dep in view.deployments.items():
            pool_name = self._owner.get(name)
            if pool_name is None:
                out[name] = dep
            elif pool_name not in out:
                out[pool_name] = self._logical(self.pools[pool_name], view)
        for pool in self.pools.values():  # deployments Serve did not report (yet)
            out.setdefault(pool.name, self._logical(pool, view))
        return ClusterView(out)

    def _logical(self, pool: ShadowPool, view: ClusterView) -> DeploymentView:
        state = self._state_of(pool, view)
        parts = [_dep(view, d) for d in pool.deployments.values()]
        extra: Counter[str] = Counter()
        for part in parts:
            extra.update(part.extra_metrics)
        return DeploymentView(
            name=pool.name,
            current_replicas=_dep(view, pool.deployments[state.serving_tp]).current_replicas,
            target_replicas=state.replicas,
            min_replicas=pool.min_replicas,
            max_replicas=pool.max_replicas,
            replica_stats=tuple(s for part in parts for s in part.replica_stats),
            queued_outside=sum(part.queued_outside for part in parts),
            extra_metrics=dict(extra),
        )

    def step(self, plan: ClusterPlan, view: ClusterView, now_s: float) -> RolloutDecision:
        """Advance every shadow pool's rollout under the policy's (logical) plan."""
        targets: dict[str, int] = {}
        serving: dict[str, str] = {}
        events: list[RolloutEvent] = []
        for pool in self.pools.values():
            state = self._state_of(pool, view)
            if pool.name in plan.replicas:
                state.replicas = min(max(plan.replicas[pool.name], pool.min_replicas), pool.max_replicas)
            wanted = self._wanted_tp(pool, state, plan.tensor_parallel.get(pool.name), now_s)
            events += self._advance(pool, state, wanted, view, now_s)
            targets.update(self._targets(pool, state))
            serving[pool.name] = pool.deployments[state.serving_tp]
        return RolloutDecision(targets, serving, tuple(events))

    def _wanted_tp(self, pool: ShadowPool, state: _PoolState, planned: int | None, now_s: float) -> int:
        """The plan's TP where the pool has a deployment for it and it is not held after
        an abandoned rollout; else whatever the pool is already heading for."""
        current = state.rollout.to_tp if state.rollout else state.serving_tp
        if planned is None or planned not in pool.deployments:
            return current
        if state.held is not None:
            if state.held[0] == planned and now_s < state.held[1]:
                return current
            state.held = None
        return planned

    def _advance(self, pool: ShadowPool, state: _PoolState, wanted: int, view: ClusterView,
                 now_s: float) -> list[RolloutEvent]:
        r = state.rollout
        if r is None:
            if wanted == state.serving_tp:
                return []
            old = _dep(view, pool.deployments[state.serving_tp])
            if state.replicas == 0:  # nothing to keep serving: switch at once
                state.rollout = Rollout(state.serving_tp, wanted, now_s, 0)
                state.serving_tp = wanted
                return [self._end(pool, state, "completed", now_s)]
            state.rollout = Rollout(state.serving_tp, wanted, now_s, max(old.target_replicas, old.current_replicas))
            return []
        events = []
        if wanted != r.to_tp:
            back = wanted == r.from_tp
            events.append(self._end(pool, state, "cancelled" if back else "retargeted", now_s))
            if back:
                return events
            state.rollout = r = replace(r, to_tp=wanted, started_s=now_s)
        shadow = _dep(view, pool.deployments[r.to_tp])
        if shadow.current_replicas >= state.replicas and len(shadow.replica_stats) >= state.replicas:
            state.serving_tp = r.to_tp
            events.append(self._end(pool, state, "completed", now_s))
        elif now_s - r.started_s >= self.timeout_s:
            state.held = (r.to_tp, now_s + self.retry_after_s)
            events.append(self._end(pool, state, "abandoned", now_s))
        return events

    def _end(self, pool: ShadowPool, state: _PoolState, outcome: str, now_s: float) -> RolloutEvent:
        r = state.rollout
        assert r is not None
        state.rollout = None
        state.outcomes[outcome] += 1
        return RolloutEvent(pool.name, r.from_tp, r.to_tp, outcome, now_s - r.started_s)

    def _targets(self, pool: ShadowPool, state: _PoolState) -> dict[str, int]:
        targets = dict.fromkeys(pool.deployments.values(), 0)
        r = state.rollout
        targets[pool.deployments[state.serving_tp]] = r.old_replicas if r else state.replicas
        if r is not None:
            targets[pool.deployments[r.to_tp]] = state.replicas
        return targets

    def published(self, plan: ClusterPlan, decision: RolloutDecision) -> PublishedPlan:
        """The plan replicas and the ingress follow, by deployment: the shadow pools'
        replica targets, their clocks and batch limits on every one of their deployments,
        no TP entries for them (each deployment's TP is fixed: no replica re-shards), and
        which deployment serves each pool."""
        def spread(values: dict[str, Any]) -> dict[str, Any]:
            return {dep: value for name, value in values.items()
                    for dep in (self.pools[name].deployments.values() if name in self.pools else (name,))}

        return PublishedPlan.of(replace(
            plan,
            replicas={**{k: v for k, v in plan.replicas.items() if k not in self.pools}, **decision.targets},
            tensor_parallel={k: v for k, v in plan.tensor_parallel.items() if k not in self.pools},
            clock_mhz=spread(plan.clock_mhz),
            batch_limit=spread(plan.batch_limit),
        ), serving=decision.serving)

    def report(self) -> dict[str, dict[str, Any]]:
        """Per shadow pool: serving deployment and TP, the rollout under way, outcomes so far."""
        out = {}
        for name, state in self._state.items():
            pool, r = self.pools[name], state.rollout
            out[name] = {
                "serving": pool.deployments[state.serving_tp],
                "tensor_parallel": state.serving_tp,
                "replicas": state.replicas,
                "rollout": None if r is None else {
                    "from_tp": r.from_tp, "to_tp": r.to_tp, "deployment": pool.deployments[r.to_tp],
                    "started_s": r.started_s, "old_replicas": r.old_replicas},
                "outcomes": dict(state.outcomes),
            }
        return out
