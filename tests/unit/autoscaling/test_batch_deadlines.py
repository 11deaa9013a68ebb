"""Chiron's Algorithm 2 as a layer of the one controller: the global batch queue's request
groups set the batch rate the pools are planned for and how many batch requests the queue
may have out at once, in the policy and in the simulator that runs it."""

import numpy as np
import pytest

from autoscaling.chiron.batch_queue import (
    OutputLengthStats,
    QueuedBatchRequest,
    RequestGroup,
    batch_backpressure,
    deadline_tokens_per_s,
)
from autoscaling.chiron.deadline_capacity import DeadlineCapacity, DeadlineCapacityConfig
from autoscaling.chiron.queue_summary import summarise_queue
from autoscaling.wattwise import WattwiseConfig, WattwisePolicy
from core.classes import ServiceClass, default_service_classes
from core.roles import BATCH_QUEUE_DEPLOYMENT
from core.slo import SLO
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.profile_builder import build_profile
from sim.config import SimConfig
from sim.scenario import build
from sim.simulator import Simulator
from sim.workload import batch_dump, load_trace, window

POOLS = {"pool-short": ["SS", "SM", "SL"], "pool-medium": ["MS", "MM", "ML"], "pool-long": ["LS", "LM", "LL"]}


def test_the_deadline_rate_is_the_least_at_which_no_group_is_late() -> None:
    groups = [RequestGroup(600.0, 2000), RequestGroup(1800.0, 500), RequestGroup(3600.0, 8000)]
    rate = deadline_tokens_per_s(groups, 0.0, 200.0, 150.0)
    assert batch_backpressure(groups, 0.0, 200.0, 150.0, rate * 1.001) == 0
    assert batch_backpressure(groups, 0.0, 200.0, 150.0, rate * 0.99) > 0
    assert deadline_tokens_per_s([], 0.0, 200.0, 150.0) == 0.0


def _queue(n: int, deadline_s: float) -> dict[str, float]:
    return summarise_queue([QueuedBatchRequest(0.0, deadline_s)] * n, OutputLengthStats())


def test_a_queue_that_fits_its_deadline_needs_little_and_one_that_does_not_needs_more() -> None:
    layer = DeadlineCapacity(DeadlineCapacityConfig())
    itl_s = 0.05
    assert layer.demand({}, 0.0, itl_s).requests_per_s == 0.0
    queue = _queue(30000, 3600.0)
    small, big = layer.demand(_queue(1000, 3600.0), 0.0, itl_s), layer.demand(queue, 0.0, itl_s)
    assert 0 < small.requests_per_s < big.requests_per_s
    # Little's law: the rate times the time one request spends on a replica (its mean output).
    request_s = queue["output_mean_tokens"] * itl_s
    assert big.in_flight == pytest.approx(big.requests_per_s * request_s, abs=1)
    capped = DeadlineCapacity(DeadlineCapacityConfig(max_in_flight=64)).demand(queue, 0.0, itl_s)
    assert capped.in_flight == 64
    off = DeadlineCapacity(DeadlineCapacityConfig(enabled=False)).demand(queue, 0.0, itl_s)
    assert (off.requests_per_s, off.in_flight) == (0.0, 0)


def _view(queue: dict[str, float] | None) -> ClusterView:
    deps = {}
    for name, classes in POOLS.items():
        stats = ReplicaStats(tensor_parallel=2, itl_ewma_s=0.03, batch_rate_per_s=0.5,
                             class_rates_per_s={c: 0.5 for c in classes[:1]})
        deps[name] = DeploymentView(name, 1, 1, 1, 64, (stats,))
    if queue is not None:
        deps[BATCH_QUEUE_DEPLOYMENT] = DeploymentView(BATCH_QUEUE_DEPLOYMENT, 1, 1, 1, 1, extra_metrics=queue)
    return ClusterView(deps)


def test_the_wattwise_policy_plans_the_pools_for_the_queues_deadlines_and_lets_the_queue_send_more() -> None:
    profile = build_profile(default_perf_model("llama2-70b", "h100-80gb"))

    def plan(queue: dict[str, float] | None, enabled: bool = True):
        config = WattwiseConfig(pools=POOLS, fold_pools=False, batch_deadlines=DeadlineCapacityConfig(enabled=enabled))
        return WattwisePolicy(config, profile=profile).observe(_view(queue), 0.0)

    def gpus(p) -> int:
        return sum(p.replicas[n] * p.tensor_parallel[n] for n in POOLS)

    quiet, job = plan(_queue(10, 3600.0)), plan(_queue(40000, 3600.0))
    assert gpus(job) > gpus(quiet)
    assert job.batch_in_flight[BATCH_QUEUE_DEPLOYMENT] > 32 >= quiet.batch_in_flight[BATCH_QUEUE_DEPLOYMENT]
    # Chiron's entry says what the shapes were sized on: a floor per class under batch load.
    assert sum(job.batch_rate_floor_per_s.values()) > sum(quiet.batch_rate_floor_per_s.values())
    assert gpus(plan(_queue(40000, 3600.0), enabled=False)) == gpus(quiet)
    idle = plan(None)  # no queue reported: the layer writes nothing
    assert idle.batch_in_flight == idle.batch_rate_floor_per_s == {}


def test_a_job_too_big_for_the_queues_usual_pace_meets_its_deadline_with_the_layer() -> None:
    """A minute of conversation traffic and 1,500 batch requests due 2 minutes after they
    land: 32 out at once cannot drain them in time (43% are late); the layer can. (3,000 due
    in 4 minutes show the same, 35% late, at twice the CPU.)"""
    w = batch_dump(window(load_trace("conv"), 1800.0, 60.0), 1500, 30.0, np.random.default_rng(0))
    services = {**default_service_classes(), "batch": ServiceClass(name="batch", slo=SLO(ttft_s=120.0, tbt_s=2.0))}

    def batch_met(enabled: bool) -> float:
        setups, built = build("wattwise", w, SimConfig())
        assert isinstance(built, WattwisePolicy)
        policy = WattwisePolicy(built.config.model_copy(
            update={"batch_deadlines": DeadlineCapacityConfig(enabled=enabled)}), profile=built.profile)
        log = Simulator(w, policy, setups, SimConfig(), services=services).run().log
        return float(np.mean(log.ttft_s[~w.interactive] <= 120.0))

    assert batch_met(True) >= 0.99 > batch_met(False) + 0.05
