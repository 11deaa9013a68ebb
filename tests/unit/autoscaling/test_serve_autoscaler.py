"""Ray Serve's default autoscaling as a pure policy: its delays, look-back, cold start, and the
informed operator's settings; and `policy: serve-autoscaler` through the Serve adapter."""

from __future__ import annotations

from autoscaling.serve_autoscaler import (
    ServeAutoscalerConfig,
    ServeAutoscalerPolicy,
    busiest_operating,
    most_efficient_tp,
)
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.serve_adapter import AppAutoscalingPolicy
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load
from tests.factories import autoscaling_context, by_deployment

# A look-back of one tick isolates the delays from the averaging.
INSTANT = dict(target_ongoing_requests={"pool": 10.0}, look_back_period_s=1.0)


def _view(ongoing: float, running: int, target: int | None = None, queued: float = 0.0) -> ClusterView:
    per_replica = int(ongoing // max(running, 1))
    stats = tuple(ReplicaStats(running_requests=per_replica) for _ in range(running))
    outside = ongoing - per_replica * running + queued
    return ClusterView({"pool": DeploymentView("pool", running, running if target is None else target, 1, 16,
                                               stats, queued_outside=outside)})


def test_scales_up_to_ceil_ongoing_over_target_only_after_the_upscale_delay():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(**INSTANT))
    assert policy.observe(_view(35, 1), 0.0).replicas["pool"] == 1
    assert policy.observe(_view(35, 1), 29.0).replicas["pool"] == 1
    assert policy.observe(_view(35, 1), 30.0).replicas["pool"] == 4  # ceil(35 / 10)


def test_scales_down_only_after_the_downscale_delay():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(**INSTANT))
    assert policy.observe(_view(12, 4), 0.0).replicas["pool"] == 4
    assert policy.observe(_view(12, 4), 599.0).replicas["pool"] == 4
    assert policy.observe(_view(12, 4), 600.0).replicas["pool"] == 2


def test_a_tick_at_the_target_restarts_the_wait():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(**INSTANT))
    policy.observe(_view(35, 1), 0.0)
    policy.observe(_view(10, 1), 20.0)  # desired == target: the pending scale-up is dropped
    assert policy.observe(_view(35, 1), 40.0).replicas["pool"] == 1
    assert policy.observe(_view(35, 1), 70.0).replicas["pool"] == 4


def test_ongoing_requests_are_averaged_over_the_look_back_window():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(target_ongoing_requests={"pool": 10.0}, upscale_delay_s=0))
    for t in range(30):
        assert policy.observe(_view(10, 1), float(t)).replicas["pool"] == 1
    # One tick at 100 among 30 s of 10: the 30 s mean is 13, so 2 replicas, not 10.
    assert policy.observe(_view(100, 1), 30.0).replicas["pool"] == 2


def test_a_deployment_with_no_running_replica_and_requests_starts_one_at_once():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(**INSTANT))
    view = ClusterView({"pool": DeploymentView("pool", 0, 0, 0, 16, (), queued_outside=50.0)})
    assert policy.observe(view, 0.0).replicas["pool"] == 1


def test_the_plan_locks_the_configured_clock_and_keeps_the_bounds():
    policy = ServeAutoscalerPolicy(ServeAutoscalerConfig(target_ongoing_requests={"pool": 1.0}, upscale_delay_s=0,
                                                         clock_mhz={"pool": 1980}))
    plan = policy.observe(_view(1000, 1), 0.0)
    assert plan.clock_mhz == {"pool": 1980}
    assert plan.replicas["pool"] == 16  # the deployment's max_replicas


def test_the_busiest_load_of_one_replica_is_the_edge_of_the_tbt_target():
    cap = CapacityModel(default_perf_model("llama2-70b", "h100-80gb", None))
    shape, clock = Load(1.0, 1000.0, 200.0), cap.perf.gpu.max_clock_mhz
    tp = most_efficient_tp(cap, shape, 0.1)
    assert tp in cap.perf.tensor_parallel_degrees
    rate, op = busiest_operating(cap, tp, clock, shape, 0.1)
    assert op.feasible and 0.09 < op.tbt_s <= 0.1
    above = cap.operating(tp, clock, 1, Load(rate * 1.01, 1000.0, 200.0), 0.1)
    assert not above.feasible


def test_serve_runs_it_as_a_policy_from_serve_config():
    policy = AppAutoscalingPolicy(policy="serve-autoscaler", target_ongoing_requests={"pool-a": 4.0},
                                  upscale_delay_s=0.0)
    ctx = autoscaling_context("pool-a", 2, {"running_requests": [10, 10]}, now_s=100.0)
    decisions, _ = policy(by_deployment(ctx))
    assert decisions == {ctx.deployment_id: 5}  # ceil(20 / 4)
