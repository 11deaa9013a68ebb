"""NVIDIA Dynamo's SLA planner as a pure policy: replicas from a predicted load and the profile's
throughputs, on its adjustment interval, corrected by observed ITL; its load predictors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaling.sla_planner.load_predictors import ArimaPredictor, arima_forecast, differences_needed
from autoscaling.sla_planner.policy import (
    SlaPlannerConfig,
    SlaPlannerPolicy,
    SlaPool,
    decode_tokens_per_gpu_s,
    prefill_tokens_per_gpu_s,
    recommended_tp,
)
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.serve_adapter import AppAutoscalingPolicy
from energy.capacity import Load
from tests.factories import autoscaling_context, by_deployment

POOL = SlaPool(tensor_parallel=4, clock_mhz=1980, ttft_s=0.4, itl_s=0.1, mean_prompt_tokens=500,
               mean_output_tokens=200)


def _planner(**kw) -> SlaPlannerPolicy:
    return SlaPlannerPolicy(SlaPlannerConfig(pools={"pool": POOL}, load_predictor="constant", **kw))


def _view(rate_per_s: float, replicas: int = 1, running: int = 0, itl_s: float = 0.0) -> ClusterView:
    stats = tuple(ReplicaStats(running_requests=running, itl_ewma_s=itl_s,
                               class_rates_per_s={"MM": rate_per_s / replicas}) for _ in range(replicas))
    return ClusterView({"pool": DeploymentView("pool", replicas, replicas, 1, 64, stats)})


def test_replicas_are_the_binding_one_of_prefill_and_decode_throughput_at_the_slos():
    planner = _planner(correction=False)
    cap = planner.cap
    decode_per_replica = decode_tokens_per_gpu_s(cap, 4, 1980, 600, 0.1) * 4
    prefill_per_replica = prefill_tokens_per_gpu_s(cap, 4, 1980, 500) * 4
    assert decode_per_replica * 500 / 200 < prefill_per_replica  # this pool's decode binds
    requests = 180 * 30.0  # 30 req/s over the interval
    assert planner.replicas_for("pool", requests) == math.ceil(30 * 200 / decode_per_replica)
    assert planner.replicas_for("pool", 0.0) == 1  # min_endpoint


def test_it_adjusts_on_its_interval_from_the_load_it_saw():
    planner = _planner(correction=False)
    for t in range(180):
        assert "pool" not in planner.observe(_view(30.0), float(t)).replicas
    first = planner.observe(_view(30.0), 180.0).replicas["pool"]
    assert first == planner.replicas_for("pool", 30.0 * 180)
    for t in range(181, 360):  # the load triples, but nothing moves before the next adjustment
        assert planner.observe(_view(90.0), float(t)).replicas["pool"] == first
    assert planner.observe(_view(90.0), 360.0).replicas["pool"] > 2 * first


def test_an_itl_over_the_profiles_tightens_the_target_and_adds_replicas():
    plain, corrected = _planner(correction=False), _planner()
    expected_itl = plain.cap.decode_iteration_s(4, 1980, 50, POOL.context_tokens)
    for t in range(181):
        view = _view(100.0, replicas=2, running=50, itl_s=2 * expected_itl)
        n_plain = plain.observe(view, float(t)).replicas.get("pool")
        n_corrected = corrected.observe(view, float(t)).replicas.get("pool")
    assert n_plain is not None and n_corrected is not None
    assert n_corrected > n_plain > 1


def test_the_profilers_tp_prefills_the_mean_prompt_within_the_ttft_target():
    planner = _planner()
    cap, shape = planner.cap, Load(1.0, 2000.0, 200.0)
    tps = sorted(cap.perf.tensor_parallel_degrees)
    # A TTFT target between the smallest TP's prefill and the next one's rules the smallest out.
    ttft = (cap.prefill_s(tps[0], 1980, 2000.0) + cap.prefill_s(tps[1], 1980, 2000.0)) / 2
    tp = recommended_tp(cap, shape, ttft, 0.1)
    assert tp != tps[0] and cap.prefill_s(tp, 1980, 2000.0) <= ttft


def test_arima_differences_a_random_walk_and_extrapolates_a_trend():
    rng = np.random.default_rng(0)
    assert differences_needed(rng.normal(100, 5, 40)) == 0
    assert differences_needed(np.cumsum(rng.normal(1, 1, 40))) >= 1
    trend = 10.0 * np.arange(1, 21) + rng.normal(0, 1, 20)
    assert arima_forecast(trend) == pytest.approx(210, rel=0.05)


def test_the_arima_predictor_repeats_the_last_value_until_it_has_five():
    predictor = ArimaPredictor()
    for value in (5.0, 6.0, 7.0, 8.0):
        predictor.add(value)
        assert predictor.predict() == value
    predictor.add(9.0)
    assert predictor.predict() == pytest.approx(10.0, rel=0.1)


def test_serve_runs_it_as_a_policy_from_serve_config():
    policy = AppAutoscalingPolicy(policy="sla-planner", pools={"pool-a": POOL.model_dump()}, load_predictor="constant",
                                  adjustment_interval_s=10.0)
    metrics = {"running_requests": [1, 1], "rate_per_s.MM": [50.0, 50.0]}
    first, _ = policy(by_deployment(autoscaling_context("pool-a", 2, metrics, now_s=100.0)))
    assert list(first.values()) == [2]  # no adjustment yet: Serve's target stays
    ctx = autoscaling_context("pool-a", 2, metrics, now_s=110.0)
    decisions, _ = policy(by_deployment(ctx))
    assert decisions[ctx.deployment_id] == policy.policy.replicas_for("pool-a", 100.0 * 10.0) > 2
