"""Chiron's autoscalers on hand-made stats, and request groups against brute force."""

import math
from dataclasses import replace

import numpy as np
import pytest

from autoscaling.chiron.batch_queue import (
    OutputLengthStats,
    QueuedBatchRequest,
    RequestGroup,
    batch_backpressure,
    batch_instances_needed,
    group_requests,
    group_waits_s,
)
from autoscaling.chiron.local import LocalAutoscalerConfig, LocalBatchAutoscaler
from autoscaling.chiron.over_provisioning import theta_from_arrivals
from autoscaling.chiron.policy import ChironConfig, ChironPolicy, split_interactive_mixed
from autoscaling.chiron.queue_summary import groups_from_metrics, summarise_queue
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView


def test_algorithm_1_halves_on_latency_backpressure() -> None:
    a = LocalBatchAutoscaler(LocalAutoscalerConfig(initial_batch=64))
    assert a.update(itl_s=0.3, itl_slo_s=0.2, throughput=1000, running=64, tokens_total=100) == 32
    # Below its limit the batch is not what stretches the ITL: no halving.
    assert a.update(itl_s=0.3, itl_slo_s=0.2, throughput=1000, running=10, tokens_total=200) == 32


def test_algorithm_1_grows_by_ewma_proportional_to_inverse_backpressure() -> None:
    a = LocalBatchAutoscaler(LocalAutoscalerConfig(initial_batch=16))
    # LBP = 0.1/0.2 = 0.5 -> 0.5 * 2 * 16 + 0.5 * 16 = 24
    assert a.update(itl_s=0.1, itl_slo_s=0.2, throughput=1000, running=4, tokens_total=100) == 24


def test_throughput_backpressure_only_when_the_batch_is_full() -> None:
    a = LocalBatchAutoscaler(LocalAutoscalerConfig(initial_batch=16))
    a.update(0.1, 0.2, throughput=1000, running=16, tokens_total=100)  # 24
    # Throughput fell by half while not saturated: light load, not backpressure.
    assert a.update(0.1, 0.2, throughput=500, running=3, tokens_total=200) == 36
    # Saturated and throughput fell: TBP = 500/400 > 1 -> halve.
    assert a.update(0.1, 0.2, throughput=400, running=36, tokens_total=300) == 18


def test_noisy_samples_do_not_move_the_limit() -> None:
    a = LocalBatchAutoscaler(LocalAutoscalerConfig(initial_batch=16, min_tokens_per_update=50))
    assert a.update(0.5, 0.2, 1000, 16, tokens_total=10) == 16  # too few new tokens
    assert a.update(0.0, 0.2, 1000, 16, tokens_total=100) == 16  # no ITL measured yet


def test_limit_stays_in_bounds() -> None:
    a = LocalBatchAutoscaler(LocalAutoscalerConfig(initial_batch=2, min_batch=2))
    for i in range(5):
        a.update(1.0, 0.2, 100, 2, tokens_total=100 * (i + 1))
    assert a.limit == 2


def test_groups_cluster_deadlines_and_keep_order() -> None:
    q = [QueuedBatchRequest(0, 1000), QueuedBatchRequest(1, 1100), QueuedBatchRequest(2, 5000),
         QueuedBatchRequest(3, 1050)]
    assert group_requests(q, window_s=300) == [RequestGroup(1000, 3), RequestGroup(5000, 1)]


def test_wait_estimate_matches_brute_force_simulation() -> None:
    """Eq. 1 with the CLT bound vs sampling output lengths and draining the queue."""
    rng = np.random.default_rng(0)
    groups = [RequestGroup(100, 40), RequestGroup(400, 60)]
    mean, std, rate = 200.0, 120.0, 2000.0
    est = group_waits_s(groups, mean, std, rate, z=1.645)
    samples = np.maximum(rng.normal(mean, std, (20000, 100)), 1)
    for g_end, w in zip((40, 100), est, strict=True):
        true_waits = samples[:, : g_end - 1].sum(axis=1) / rate
        assert np.mean(true_waits <= w) == pytest.approx(0.95, abs=0.02)  # a 95% bound


def test_algorithm_2_adds_the_fewest_instances_for_zero_bbp() -> None:
    groups = [RequestGroup(deadline_s=60, count=100)]
    # 99 requests x 200 tokens ahead (+ CLT margin) at 1000 tok/s per instance within 60 s
    n = batch_instances_needed(groups, 0.0, 200.0, 0.0, 1000.0)
    assert batch_backpressure(groups, 0.0, 200.0, 0.0, n * 1000.0) == 0
    assert batch_backpressure(groups, 0.0, 200.0, 0.0, (n - 1) * 1000.0) == 1
    assert n == math.ceil(99 * 200 / 60 / 1000)


def test_queue_summary_round_trips_groups() -> None:
    q = [QueuedBatchRequest(0, 3600.0 + i) for i in range(5)]
    metrics = summarise_queue(q, OutputLengthStats())
    assert groups_from_metrics(metrics) == [RequestGroup(3600.0, 5)]


def _dep(name: str, replicas: int, interactive: list[int], running: list[int] | None = None,
         tokens_per_s: float = 0.0, extra: dict | None = None) -> DeploymentView:
    running = running or [0] * replicas
    stats = tuple(ReplicaStats(interactive_running=i, running_requests=r, batch_limit=32, tokens_per_s=tokens_per_s)
                  for i, r in zip(interactive, running, strict=True))
    return DeploymentView(name, replicas, replicas, 0, 64, stats, 0.0, extra or {})


def _view(inter, mixed, batch, queue_metrics=None) -> ClusterView:
    deps = {d.name: d for d in (inter, mixed, batch)}
    if queue_metrics is not None:
        deps["batch-queue"] = DeploymentView("batch-queue", 1, 1, 1, 1, (ReplicaStats(),), 0.0, queue_metrics)
    return ClusterView(deps)


def test_ibp_above_band_adds_interactive_and_mixed_replicas() -> None:
    policy = ChironPolicy(ChironConfig())
    # 3 of 3 replicas running interactive work: IBP = 1 > 1/3 + 0.1 -> 9 in total.
    plan = policy.observe(_view(_dep("pool-interactive", 1, [5]), _dep("pool-mixed", 2, [3, 2]),
                                _dep("pool-batch", 0, [])), 0.0)
    assert plan.replicas["pool-interactive"] + plan.replicas["pool-mixed"] == 9
    assert plan.replicas["pool-interactive"] == 3


def test_ibp_inside_band_holds() -> None:
    plan = ChironPolicy().observe(_view(_dep("pool-interactive", 1, [4]), _dep("pool-mixed", 2, [0, 0]),
                                        _dep("pool-batch", 0, [])), 0.0)
    assert (plan.replicas["pool-interactive"], plan.replicas["pool-mixed"]) == (1, 2)


def test_missing_stats_never_shrink() -> None:
    inter = DeploymentView("pool-interactive", 3, 3, 0, 64, (ReplicaStats(),))  # 1 of 3 reported
    plan = ChironPolicy().observe(_view(inter, _dep("pool-mixed", 6, [0] * 6), _dep("pool-batch", 0, [])), 0.0)
    assert plan.replicas["pool-interactive"] == 3 and plan.replicas["pool-mixed"] == 6


def test_batch_replicas_follow_bbp_and_retire_when_idle() -> None:
    policy = ChironPolicy(ChironConfig(batch_tokens_per_s=1000))
    q = [QueuedBatchRequest(0, 60.0) for _ in range(1500)]  # ~5000 tok/s needed; mixed spare 2000
    lengths = OutputLengthStats(prior_mean=200, prior_std=0)
    busy = _view(_dep("pool-interactive", 1, [1]), _dep("pool-mixed", 2, [0, 0]), _dep("pool-batch", 0, []),
                 summarise_queue(q, lengths))
    grown = policy.observe(busy, 0.0).replicas["pool-batch"]
    assert grown > 0
    idle = _view(_dep("pool-interactive", 1, [1]), _dep("pool-mixed", 2, [0, 0]),
                 _dep("pool-batch", grown, [0] * grown), summarise_queue([], lengths))
    assert policy.observe(idle, 1.0).replicas["pool-batch"] == 0
    assert policy.actions == 2 and policy.scale_ups == 1 and policy.hysteresis == 2.0


def test_interactive_capacity_shrinks_only_after_the_hold() -> None:
    policy = ChironPolicy(ChironConfig(downscale_hold_s=30))
    idle = _view(_dep("pool-interactive", 3, [1, 0, 0]), _dep("pool-mixed", 6, [0] * 6), _dep("pool-batch", 0, []))
    assert policy.observe(idle, 0.0).replicas["pool-mixed"] == 6
    assert policy.observe(idle, 29.0).replicas["pool-mixed"] == 6
    shrunk = policy.observe(idle, 30.0).replicas
    assert shrunk["pool-interactive"] + shrunk["pool-mixed"] < 9


def test_replicas_still_starting_are_not_taken_back_by_a_lower_reading() -> None:
    """Asked for 2 + 4, 1 + 2 running: a reading of one busy replica (IBP 1/3, in band) or of
    two (wants 6, what is planned) keeps the 2 + 4 starting; only a hold of low IBP shrinks."""
    policy = ChironPolicy(ChironConfig(downscale_hold_s=30))

    def starting(inter_busy: list[int], mixed_busy: list[int], now_s: float) -> dict[str, int]:
        inter = replace(_dep("pool-interactive", 1, inter_busy), target_replicas=2)
        mixed = replace(_dep("pool-mixed", 2, mixed_busy), target_replicas=4)
        return policy.observe(_view(inter, mixed, _dep("pool-batch", 0, [])), now_s).replicas

    for now_s, busy in ((0.0, ([1], [0, 0])), (1.0, ([1], [1, 0])), (2.0, ([0], [0, 0]))):
        shape = starting(*busy, now_s)
        assert (shape["pool-interactive"], shape["pool-mixed"]) == (2, 4), (now_s, shape)
    assert starting([0], [0, 0], 40.0)["pool-mixed"] < 4  # low for the whole hold: now it shrinks


def test_theta_is_the_mean_rate_over_the_tail_spike() -> None:
    # 100 windows of 10 s: 97 with 10 arrivals, 3 spikes of 30 (three times the usual rate).
    counts = [10] * 97 + [30] * 3
    arrivals = np.concatenate([np.linspace(10 * i, 10 * i + 9.9, n) for i, n in enumerate(counts)])
    theta = theta_from_arrivals(arrivals, window_s=10.0, percentile=98.0)
    assert theta == pytest.approx(np.mean(counts) / 30)
    # The same arrivals over 1,000 s windows hold no spike: theta is at its cap.
    assert theta_from_arrivals(arrivals, window_s=1000.0) == pytest.approx(0.95)
    assert theta_from_arrivals(np.array([]), window_s=10.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="window_s"):
        theta_from_arrivals(arrivals, window_s=0.0)


def test_burstier_history_keeps_more_spare_capacity() -> None:
    rng = np.random.default_rng(0)
    steady = np.sort(rng.uniform(0, 3600, 7200))
    bursts = np.sort(np.concatenate([steady, rng.uniform(0, 30, 1500) + rng.choice([600, 2400], 1500)]))
    assert theta_from_arrivals(bursts, 30.0) < theta_from_arrivals(steady, 30.0)


@pytest.mark.parametrize(("total", "theta", "split"), [(3, 1 / 3, (1, 2)), (9, 1 / 3, (3, 6)), (2, 0.65, (1, 1)),
                                                        (5, 0.83, (4, 1)), (4, 1 / 3, (1, 3)), (1, 0.5, (1, 1))])
def test_interactive_replicas_are_theta_of_the_total_rounded_down_one_of_each_at_least(total, theta, split) -> None:
    assert split_interactive_mixed(total, theta) == split
