"""The utilisation policy (pure) and its Ray Serve adapter, without a cluster."""

from ray.serve.config import AutoscalingContext

from autoscaling.utilisation import UtilisationConfig, UtilisationPolicy
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.serve_adapter import AppAutoscalingPolicy, view_from_contexts
from tests.factories import autoscaling_context


def _view(load_per_replica: int, replicas: int = 1, kv: int = 0) -> ClusterView:
    stats = tuple(
        ReplicaStats(running_requests=load_per_replica, kv_blocks_used=kv, kv_blocks_total=100) for _ in range(replicas)
    )
    dep = DeploymentView("pool", replicas, replicas, 1, 8, stats)
    return ClusterView({"pool": dep})


def test_scales_up_at_once_to_the_middle_of_the_band() -> None:
    policy = UtilisationPolicy(UtilisationConfig(target_requests_per_replica=10))
    # 20 requests on 1 replica: utilisation 2.0 -> ceil(2.0 / 0.55) = 4 replicas.
    assert policy.observe(_view(20), 0.0).replicas["pool"] == 4


def test_kv_pressure_alone_scales_up() -> None:
    policy = UtilisationPolicy(UtilisationConfig(target_requests_per_replica=100))
    assert policy.observe(_view(1, kv=95), 0.0).replicas["pool"] == 2


def test_scale_down_waits_for_the_hold_period() -> None:
    policy = UtilisationPolicy(UtilisationConfig(target_requests_per_replica=10, downscale_hold_s=30))
    assert policy.observe(_view(1, replicas=4), 0.0).replicas["pool"] == 4
    assert policy.observe(_view(1, replicas=4), 29.0).replicas["pool"] == 4
    assert policy.observe(_view(1, replicas=4), 30.0).replicas["pool"] == 1


def test_a_busy_tick_resets_the_hold() -> None:
    policy = UtilisationPolicy(UtilisationConfig(target_requests_per_replica=10, downscale_hold_s=30))
    policy.observe(_view(1, replicas=4), 0.0)
    policy.observe(_view(25, replicas=4), 20.0)  # inside the band: not low any more
    assert policy.observe(_view(1, replicas=4), 40.0).replicas["pool"] == 4


def test_bounds_are_respected() -> None:
    policy = UtilisationPolicy(UtilisationConfig(target_requests_per_replica=1))
    assert policy.observe(_view(1000), 0.0).replicas["pool"] == 8


def _ctx(name: str, replicas: int, running: list[int], total_requests: float) -> AutoscalingContext:
    return autoscaling_context(name, replicas, {"running_requests": running, "kv_blocks_total": 100.0},
                               total_requests=total_requests)


def test_adapter_builds_the_view_from_replica_metrics() -> None:
    view = view_from_contexts({c.deployment_id: c for c in [_ctx("pool-a", 2, [3, 5], 12.0)]})
    dep = view.deployments["pool-a"]
    assert [s.running_requests for s in dep.replica_stats] == [3, 5]
    assert dep.queued_outside == 4.0  # Serve counts 12, replicas report 8


def test_adapter_returns_counts_per_deployment() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation", target_requests_per_replica=2)
    ctxs = {c.deployment_id: c for c in [_ctx("pool-a", 1, [10], 10.0), _ctx("pool-b", 1, [1], 1.0)]}
    decisions, _ = policy(ctxs)
    assert {d.name: n for d, n in decisions.items()} == {"pool-a": 5, "pool-b": 1}


def test_adapter_fails_static_when_the_policy_raises() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation")

    def broken(view, now):
        raise RuntimeError("solver exploded")

    policy.policy.observe = broken
    ctxs = {c.deployment_id: c for c in [_ctx("pool-a", 3, [1, 1, 1], 3.0)]}
    decisions, state = policy(ctxs)
    assert list(decisions.values()) == [3]
    assert next(iter(state.values()))["policy_failures"] == 1
