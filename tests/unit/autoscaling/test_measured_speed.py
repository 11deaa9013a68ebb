"""The one controller follows the step times its replicas measure, not only its profile:
each replica times its steps against the planner's perf model (batching.step_speed), and
the planner plans a pool whose engine runs f times slower as the profile's engine at f
times the load and 1/f of the SLOs."""

from dataclasses import replace

import pytest

from autoscaling.dynamollm.shape_planner import AS_PROFILED, Dilation, PoolShapePlanner, ShapePlannerConfig
from autoscaling.wattwise import WattwiseConfig, WattwisePolicy
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from bench.measured_speed import WORLDS, run_one
from core.classes import LengthClassConfig
from core.request import Request
from core.slo import SLO
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.profile_builder import build_profile
from engines.vllm_stats import VllmStep
from engines.vllm_step_speed import VllmStepSpeed

LENGTHS = LengthClassConfig()
PLANNED = "mlenergy-llama3-70b-h100"
SLOWER = "splitwise-llama2-70b-h100"  # per step: decode 1.5-1.8x PLANNED's at TP2, 2.5-4x at TP8; prefill 2.8x


@pytest.fixture(scope="module")
def profile():
    return build_profile(default_perf_model("llama2-70b", "h100-80gb", PLANNED))


def _run_steps(batcher: ContinuousBatcher, requests: int = 8) -> None:
    for i in range(requests):
        batcher.add(Request(request_id=f"r{i}", prompt_tokens=400, max_tokens=40, length_class="SS",
                            slo=SLO(ttft_s=1.0, tbt_s=0.1), arrival_s=0.0), 0.0)
    now = 0.0
    while (step := batcher.plan_step(now)) is not None:
        batcher.finish_step(step)
        now = step.end_s


def test_a_replica_measures_how_much_slower_its_engine_runs_than_the_planned_model() -> None:
    planned = default_perf_model("llama2-70b", "h100-80gb", PLANNED)
    slower = default_perf_model("llama2-70b", "h100-80gb", SLOWER)
    config = BatcherConfig(tensor_parallel=4)
    off_model = ContinuousBatcher(slower, config, planned_perf=planned)
    _run_steps(off_model)
    assert 1.5 < off_model.stats(100.0).step_time_ratio < 4.0
    as_planned = ContinuousBatcher(planned, config, planned_perf=planned)  # the planner's model is its own
    _run_steps(as_planned)
    assert as_planned.speed is None and as_planned.stats(100.0).step_time_ratio == 1.0
    assert ContinuousBatcher(slower, config, planned_perf=planned).stats(0.0).step_time_ratio == 0.0  # no step yet
    assert ContinuousBatcher(planned, config).stats(0.0).step_time_ratio == 1.0  # nothing to compare with


def test_a_vllm_replica_times_its_busy_steps_and_not_its_idle_gaps() -> None:
    """vLLM's step reports (when each step's outputs arrived) against the planned model:
    steps 2.5x the model's length read 2.5; an idle pause between bursts is not a step."""
    planned = default_perf_model("llama2-70b", "h100-80gb", PLANNED)
    speed = VllmStepSpeed(planned, tensor_parallel=4, block_size=16, clock_mhz=lambda: 0.0)
    t_s = 0.0
    for _burst in range(3):
        speed.observe(VllmStep(t_s, running=8, waiting=0, kv_blocks_used=200, prompt_tokens=0, generated_tokens=8))
        for _ in range(20):
            t_s += 2.5 * planned.iteration(0, 0.0, 8, 200 * 16, 4, planned.gpu.max_clock_mhz).time_s
            speed.observe(VllmStep(t_s, running=8, waiting=0, kv_blocks_used=200, prompt_tokens=0,
                                   generated_tokens=8))
        speed.observe(VllmStep(t_s, running=0, waiting=0, kv_blocks_used=0, prompt_tokens=0, generated_tokens=0))
        t_s += 30.0  # idle until the next burst
    assert speed.ratio == pytest.approx(2.5, rel=0.02)


def test_a_slower_pool_is_planned_with_more_instances_and_a_faster_one_with_fewer(profile) -> None:
    """At TP4: one instance at half the profile's step times, two as profiled, five at twice
    (at 1,600 MHz). At TP2 no clock carries SS beside SM at twice the step times: the short
    prompts' TTFT, halved, no longer covers a wait behind an SM prefill."""
    planner = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    rates = {"SS": 36.0, "SM": 12.0}
    gpus = {d: planner.cheapest(rates, 96, dilation=Dilation(d), tps=[4]) for d in (0.5, 1.0, 2.0)}
    assert gpus[0.5].instances < gpus[1.0].instances < gpus[2.0].instances
    assert gpus[2.0].power_w > gpus[1.0].power_w  # more, busier replicas
    # A replica's clock floor follows too: the same replicas need a higher clock when slower.
    assert planner.clock_for(rates, 4, gpus[1.0].instances, Dilation(1.3)) > gpus[1.0].clock_mhz


def test_small_or_unfollowed_deviations_leave_the_profile_as_it_is(profile) -> None:
    planner = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    assert planner.dilation("p", []) == AS_PROFILED
    assert planner.dilation("p", [1.05, 0.97, 1.08]) == AS_PROFILED  # within the deadband: noise
    assert planner.dilation("p", [2.1, 1.9, 5.0]).slowdown == pytest.approx(2.1)  # the median, not one outlier
    # New replicas (0: no step timed yet) neither dilute the median nor reset what was learnt.
    assert planner.dilation("p", [0.0, 0.0, 1.9, 2.1, 5.0]).slowdown == pytest.approx(2.1)
    assert planner.dilation("p", [0.0, 0.0]).slowdown == pytest.approx(2.1)
    assert planner.dilation("q", [0.0]) == AS_PROFILED
    trusting = PoolShapePlanner(profile, ShapePlannerConfig(follow_measured_speed=False), LENGTHS, 33.0, 300.0)
    assert trusting.dilation("p", [2.0, 2.0]) == AS_PROFILED


def test_the_composite_plans_on_what_its_replicas_measure(profile) -> None:
    pools = {"pool-short": ["SS", "SM", "SL"]}
    stats = ReplicaStats(tensor_parallel=2, class_rates_per_s={"SS": 2.0, "SM": 1.0})

    def plan(ratio: float) -> int:
        policy = WattwisePolicy(WattwiseConfig(pools=pools, fold_pools=False), profile=profile)
        reported = replace(stats, step_time_ratio=ratio)
        view = ClusterView({"pool-short": DeploymentView("pool-short", 1, 1, 1, 64, (reported,))})
        shape = policy.observe(view, 0.0)
        return shape.replicas["pool-short"] * shape.tensor_parallel["pool-short"]

    assert plan(2.5) > plan(1.0)


def test_slower_replicas_meet_their_slos_when_the_planner_follows_their_measured_speed() -> None:
    """Seven minutes of the conversation trace on replicas slower than the profile the planner
    believes (their steps measure 1.46x the profile's when followed, 1.74x when not: the
    shapes differ): trusting it, one request in nine misses its SLO once the warm-up's
    replicas go; following the measured step times, one in 280."""
    trusting, following = (next(w for w in WORLDS if w.name == name)
                           for name in ("slower, trusting the profile", "slower, following measured speed"))
    blind = run_one(("conv", trusting, 0.0, 420.0))
    measured = run_one(("conv", following, 0.0, 420.0))
    assert measured["step_time_ratio"] > 1.3
    measured_misses, blind_misses = (1 - r["slo_attainment"]["overall"] for r in (measured, blind))
    assert measured_misses <= 0.02 and blind_misses >= 5 * measured_misses


def test_prefix_cache_hits_count_as_less_work_per_request_not_faster_steps(profile) -> None:
    """Replicas whose prompts are partly cached report the share of the profile's work they
    do (ReplicaStats.prefix_work_ratio): the planner carries the load on fewer replicas, its
    TBT headroom as it was (decodes are no faster)."""
    planner = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    assert planner.dilation("p", [1.0, 1.0], [0.97, 1.0]) == AS_PROFILED  # within the deadband
    cached = planner.dilation("p", [1.0, 1.02], [0.6, 0.7, 0.8])
    assert (cached.slowdown, cached.work) == (1.0, pytest.approx(0.7)) and cached.headroom(0.7) == 0.7
    rates = {"SS": 36.0, "SM": 12.0}
    assert cached.rates(rates) == {"SS": pytest.approx(25.2), "SM": pytest.approx(8.4)}
    assert planner.cheapest(rates, 96, dilation=cached, tps=[4]).instances < planner.cheapest(
        rates, 96, tps=[4]).instances
