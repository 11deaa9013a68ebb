"""TP changes as shadow deployments: the pure rollout state machine, its Serve adapter
(without a cluster), the pool config and the deployments the builder makes."""

from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from pydantic import ValidationError
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from app.config import AppConfig, PoolConfig
from autoscaling.shadow_rollout import SHADOW_KEY, ShadowPool, ShadowRollouts
from core.plan import ClusterPlan
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.serve_adapter import AppAutoscalingPolicy
from tests.factories import autoscaling_context

POOL = ShadowPool("pool-a", {2: "pool-a", 4: "pool-a-tp4", 8: "pool-a-tp8"}, min_replicas=1, max_replicas=4)


@dataclass
class FakeServe:
    """Deployments that follow their targets: a new replica runs `start_ticks` ticks after
    it was asked for and reports stats from the tick after; a removed one stops at once."""

    start_ticks: int = 3
    running: dict[str, int] = field(default_factory=dict)
    targets: dict[str, int] = field(default_factory=dict)
    starting: dict[str, list[int]] = field(default_factory=dict)  # ticks left per starting replica
    fresh: dict[str, int] = field(default_factory=dict)  # running since this tick: no stats yet

    def view(self) -> ClusterView:
        deps = {}
        for tp, name in POOL.deployments.items():
            n = self.running.get(name, 0)
            stats = tuple(ReplicaStats(running_requests=1, tensor_parallel=tp)
                          for _ in range(n - self.fresh.get(name, 0)))
            deps[name] = DeploymentView(name, n, self.targets.get(name, 0), 0, 4, stats)
        return ClusterView(deps)

    def apply(self, targets: dict[str, int]) -> None:
        for name, target in targets.items():
            self.targets[name] = target
            running = self.running.get(name, 0)
            starting = self.starting.setdefault(name, [])
            if target <= running:
                self.running[name] = target
                self.fresh[name] = min(self.fresh.get(name, 0), target)
                starting.clear()
            else:
                del starting[target - running:]
                starting.extend([self.start_ticks] * (target - running - len(starting)))

    def tick(self) -> None:
        for name, starting in self.starting.items():
            left = [t - 1 for t in starting]
            self.fresh[name] = sum(1 for t in left if t <= 0)
            self.running[name] = self.running.get(name, 0) + self.fresh[name]
            starting[:] = [t for t in left if t > 0]


def _serve_at(**running: int) -> FakeServe:
    serve = FakeServe()
    for name, n in running.items():
        dep = name.replace("_", "-")
        serve.running[dep] = serve.targets[dep] = n
    return serve


def _run(rollouts: ShadowRollouts, serve: FakeServe, plan: ClusterPlan, ticks: int, t0: float = 0.0):
    decisions = []
    for i in range(ticks):
        serve.tick()
        decision = rollouts.step(plan, serve.view(), t0 + i)
        serve.apply(decision.targets)
        decisions.append((decision, dict(serve.running)))
    return decisions


def test_switches_only_when_the_shadow_runs_and_reports_and_never_below_the_old_count() -> None:
    serve = _serve_at(pool_a=3)
    rollouts = ShadowRollouts([POOL], timeout_s=100)
    history = _run(rollouts, serve, ClusterPlan(replicas={"pool-a": 2}, tensor_parallel={"pool-a": 4}), 14)
    switched_at = next(i for i, (d, _) in enumerate(history) if d.serving["pool-a"] == "pool-a-tp4")
    for i, (decision, running) in enumerate(history):
        if i < switched_at:  # the old deployment serves at its count while the shadow comes up
            assert decision.serving["pool-a"] == "pool-a"
            assert running["pool-a"] == 3 and decision.targets["pool-a"] == 3
            assert decision.targets["pool-a-tp4"] == 2
        else:  # the new one serves with all its replicas; only then does the old go to 0
            # (after the adapter's handover: test_adapter_shows_the_policy_one_pool...)
            assert running.get("pool-a-tp4", 0) == 2
            assert decision.targets == {"pool-a": 0, "pool-a-tp4": 2, "pool-a-tp8": 0}
    # Running alone is not enough: the switch waited for the replicas' first stats.
    first_running = next(i for i, (_, r) in enumerate(history) if r.get("pool-a-tp4", 0) == 2)
    assert switched_at == first_running + 1
    assert [e.outcome for d, _ in history for e in d.events] == ["completed"]
    assert rollouts.report()["pool-a"]["outcomes"] == {"completed": 1}


def test_a_shadow_not_up_in_time_is_abandoned_and_not_retried_at_once() -> None:
    serve = _serve_at(pool_a=2)
    serve.start_ticks = 1000  # never comes up (no resources for the new TP)
    rollouts = ShadowRollouts([POOL], timeout_s=10, retry_after_s=30)
    plan = ClusterPlan(replicas={"pool-a": 2}, tensor_parallel={"pool-a": 8})
    history = _run(rollouts, serve, plan, 45)
    events = [(i, e) for i, (d, _) in enumerate(history) for e in d.events]
    assert [e.outcome for _, e in events] == ["abandoned"]
    abandoned_at, event = events[0]
    assert event.after_s == pytest.approx(10) and (event.from_tp, event.to_tp) == (2, 8)
    for decision, running in history[abandoned_at:]:
        assert decision.serving["pool-a"] == "pool-a" and running["pool-a"] == 2
    # held: the shadow stays at 0 until retry_after_s has passed, then it is tried again
    assert all(d.targets["pool-a-tp8"] == 0 for d, _ in history[abandoned_at:abandoned_at + 30])
    assert history[-1][0].targets["pool-a-tp8"] == 2
    assert rollouts.report()["pool-a"]["rollout"]["to_tp"] == 8


def test_a_new_tp_mid_rollout_retargets_and_going_back_cancels() -> None:
    serve = _serve_at(pool_a=2)
    serve.start_ticks = 5
    rollouts = ShadowRollouts([POOL], timeout_s=100)
    _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 4}), 2)
    assert serve.targets["pool-a-tp4"] == 2
    history = _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 8}), 10, t0=2)
    first = history[0][0]
    assert [e.outcome for e in first.events] == ["retargeted"]
    assert first.targets == {"pool-a": 2, "pool-a-tp4": 0, "pool-a-tp8": 2}
    assert history[-1][0].serving["pool-a"] == "pool-a-tp8"
    # Back to the serving TP while the next rollout runs: the shadow is dropped.
    _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 2}), 1, t0=20)
    history = _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 8}), 1, t0=21)
    assert [e.outcome for e in history[0][0].events] == ["cancelled"]
    assert history[0][0].serving["pool-a"] == "pool-a-tp8"
    assert history[0][0].targets == {"pool-a": 0, "pool-a-tp4": 0, "pool-a-tp8": 2}


def test_plan_tp_without_a_deployment_is_ignored_and_an_empty_pool_switches_at_once() -> None:
    serve = _serve_at(pool_a=1)
    rollouts = ShadowRollouts([POOL], timeout_s=100)
    (decision, _), = _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 16}), 1)
    assert decision.targets["pool-a"] == 1 and not decision.events
    (decision, _), = _run(rollouts, serve, ClusterPlan(replicas={"pool-a": 0}, tensor_parallel={"pool-a": 4}), 1)
    # the pool's own min_replicas (1) holds, so a rollout starts...
    assert decision.targets == {"pool-a": 1, "pool-a-tp4": 1, "pool-a-tp8": 0}
    empty = ShadowRollouts([ShadowPool("pool-a", POOL.deployments, min_replicas=0)], timeout_s=100)
    (decision, _), = _run(empty, _serve_at(pool_a=1), ClusterPlan(replicas={"pool-a": 0},
                                                                  tensor_parallel={"pool-a": 4}), 1)
    # ...while a pool planned to 0 replicas has nothing to keep serving: it switches at once.
    assert decision.serving["pool-a"] == "pool-a-tp4" and [e.outcome for e in decision.events] == ["completed"]


def test_the_logical_view_hides_shadows_and_the_published_plan_maps_the_pool() -> None:
    serve = _serve_at(pool_a=2, pool_b=1)
    serve.targets["pool-b"] = 1
    rollouts = ShadowRollouts([POOL], timeout_s=100)
    _run(rollouts, serve, ClusterPlan(tensor_parallel={"pool-a": 4}), 4)
    serve.tick()  # mid-rollout: both deployments run and report
    physical = serve.view()
    physical = ClusterView({**physical.deployments, "pool-b": DeploymentView("pool-b", 1, 1, 1, 4)})
    assert physical.deployments["pool-a-tp4"].current_replicas == 2
    logical = rollouts.logical_view(physical)
    assert list(logical.deployments) == ["pool-a", "pool-b"]
    pool = logical.deployments["pool-a"]
    assert pool.current_replicas == 2 and pool.min_replicas == 1 and pool.max_replicas == 4
    assert len(pool.replica_stats) == 4  # the serving and the shadow replicas' load
    plan = ClusterPlan(replicas={"pool-a": 2, "pool-b": 3}, tensor_parallel={"pool-a": 4, "pool-b": 8},
                       clock_mhz={"pool-a": 1500, "pool-b": 1700}, batch_limit={"pool-a": 32},
                       routing_weights={"SS": {"pool-a": 1.0}})
    decision = rollouts.step(plan, physical, 5)
    published = rollouts.published(plan, decision)
    assert published.tensor_parallel == {"pool-b": 8}  # fixed-TP deployments get none: no re-sharding
    assert published.clock_mhz == {"pool-a": 1500, "pool-a-tp4": 1500, "pool-a-tp8": 1500, "pool-b": 1700}
    assert published.batch_limit == {"pool-a": 32, "pool-a-tp4": 32, "pool-a-tp8": 32}
    assert published.replicas["pool-b"] == 3 and "pool-a-tp4" in published.replicas
    assert published.routing_weights == {"SS": {"pool-a": 1.0}}  # routing stays by pool
    assert published.serving == {"pool-a": decision.serving["pool-a"]}


# ---- the Serve adapter, without a cluster -----------------------------------------------
def _ctx(name: str, replicas: int, tp: int, now_s: float = 100.0) -> AutoscalingContext:
    config = AutoscalingConfig(min_replicas=0, max_replicas=4, policy={"policy_kwargs": {
        SHADOW_KEY: ShadowPool("pool-a", {2: "pool-a", 4: "pool-a-tp4"}, 1, 4).entry(tp)}})
    return autoscaling_context(name, replicas, {"running_requests": 2.0, "tensor_parallel": float(tp)},
                               min_replicas=0, max_replicas=4, now_s=now_s, config=config)


def test_adapter_shows_the_policy_one_pool_and_rolls_its_tp_change_out() -> None:
    adapter = AppAutoscalingPolicy(policy="utilisation", handover_s=5)
    seen = []

    def policy(view, now):
        seen.append(view)
        return ClusterPlan(replicas={"pool-a": 2}, tensor_parallel={"pool-a": 4}, clock_mhz={"pool-a": 1400})

    adapter.policy.observe = policy
    ctxs = {c.deployment_id: c for c in [_ctx("pool-a", 2, 2), _ctx("pool-a-tp4", 0, 4)]}
    decisions, _ = adapter(ctxs)
    assert list(seen[0].deployments) == ["pool-a"] and seen[0].deployments["pool-a"].min_replicas == 1
    assert {d.name: n for d, n in decisions.items()} == {"pool-a": 2, "pool-a-tp4": 2}
    ctxs = {c.deployment_id: c for c in [_ctx("pool-a", 2, 2, 101.0), _ctx("pool-a-tp4", 2, 4, 101.0)]}
    decisions, _ = adapter(ctxs)
    assert adapter.rollouts.report()["pool-a"]["serving"] == "pool-a-tp4"
    assert {d.name: n for d, n in decisions.items()} == {"pool-a": 2, "pool-a-tp4": 2}  # the handover
    ctxs = {c.deployment_id: c for c in [_ctx("pool-a", 2, 2, 106.0), _ctx("pool-a-tp4", 2, 4, 106.0)]}
    decisions, _ = adapter(ctxs)
    assert {d.name: n for d, n in decisions.items()} == {"pool-a": 0, "pool-a-tp4": 2}
    assert [s.tensor_parallel for s in seen[1].deployments["pool-a"].replica_stats] == [2, 2, 4, 4]


# ---- config and builder -------------------------------------------------------------------
def _pool(**kw) -> PoolConfig:
    return PoolConfig(name="a", classes=["SS"], **kw)


@pytest.mark.parametrize(("kw", "rule"), [
    ({"engine": {"tensor_parallel": 2}, "tensor_parallel_options": [4, 8]},
     "must contain the engine's tensor_parallel"),
    ({"engine": {"tensor_parallel": 2}, "tensor_parallel_options": [2, 2]}, "must be unique"),
    ({"engine": {"tensor_parallel": 2}, "tensor_parallel_options": [2, 0]}, "positive"),
    ({"engine": {"kind": "vllm", "model": "/m"}, "tp_change": "in_place"}, "cannot re-shard in place"),
])
def test_bad_tp_options_are_rejected_naming_the_field(kw: dict, rule: str) -> None:
    with pytest.raises(ValidationError) as err:
        _pool(**kw)
    assert rule in str(err.value)
    assert "tensor_parallel_options" in str(err.value) or "tp_change" in str(err.value)


def test_shadow_pools_get_a_deployment_per_tp_at_zero_replicas() -> None:
    from deployments.builder import _pool_deployments

    assert _pool(engine={"tensor_parallel": 2}, tensor_parallel_options=[2, 4]).deployments_by_tp() == {2: "pool-a"}
    vllm = _pool(engine={"kind": "vllm", "model": "/m", "tensor_parallel": 1}, tensor_parallel_options=[2, 1],
                 autoscaling={"min_replicas": 1, "max_replicas": 2})
    apps = _pool_deployments(vllm, AppConfig.model_construct())
    assert list(apps) == ["pool-a", "pool-a-tp2"]
    primary, shadow = (apps[n]._bound_deployment for n in apps)
    assert primary.init_args[1]["tensor_parallel"] == 1 and shadow.init_args[1]["tensor_parallel"] == 2
    assert primary._deployment_config.autoscaling_config.initial_replicas == 1
    shadow_scaling = shadow._deployment_config.autoscaling_config
    assert (shadow_scaling.min_replicas, shadow_scaling.initial_replicas) == (0, 0)
    assert shadow_scaling.policy.policy_kwargs[SHADOW_KEY]["tensor_parallel"] == 2
    # vLLM's placement follows the deployment's own TP: TP2 runs its workers in a placement group
    assert primary._replica_config.placement_group_bundles is None
    assert len(shadow._replica_config.placement_group_bundles) == 3


def test_a_replica_that_cannot_take_the_plans_tp_still_applies_its_clock_and_batch_limit() -> None:
    from deployments.replica import LLMReplica, ReplicaIdentity
    from engines.protocol import TensorParallelChangeUnsupported

    class Engine:
        clock_mhz = batch_limit = None
        gpu_ids: ClassVar[list[int]] = []

        def stats(self) -> ReplicaStats:
            return ReplicaStats(tensor_parallel=1)

        def set_tensor_parallel(self, tp: int) -> None:
            raise TensorParallelChangeUnsupported("vLLM cannot re-shard")

        def set_clock_band(self, low_mhz: float, high_mhz: float) -> None:  # as vLLM: runs at the floor
            self.clock_mhz = low_mhz

        def set_batch_limit(self, limit: int) -> None:
            self.batch_limit = limit

    replica = LLMReplica("a", Engine(), ReplicaIdentity("app", "pool-a", "r0"))  # type: ignore[arg-type]
    replica.apply_plan(ClusterPlan(tensor_parallel={"pool-a": 2}, clock_mhz={"pool-a": 1300},
                                   batch_limit={"pool-a": 12}))
    assert (replica.engine.clock_mhz, replica.engine.batch_limit, replica._refused_tp) == (1300, 12, 2)
