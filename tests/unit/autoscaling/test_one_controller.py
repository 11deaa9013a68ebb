"""The one controller: hook chains, one owner per plan entry, the composite's planner,
one overhead table, and the simulator's predicted lengths."""

import asyncio
import math
import time
from dataclasses import replace

import numpy as np
import pytest

from autoscaling import wattwise as wattwise_module
from autoscaling.dynamollm.pool_folding import PoolFolding, partitions
from autoscaling.dynamollm.reconfig import worth_reconfiguring
from autoscaling.dynamollm.route_handover import RouteHandover
from autoscaling.dynamollm.shape_planner import (
    Dilation,
    PoolShape,
    PoolShapePlanner,
    ShapePlannerConfig,
    ShapePlannerTuning,
    cheapest_shape,
    needed_instances,
    shape_power_w,
)
from autoscaling.ownership import DECISIONS, DYNAMOLLM_FOLDING, DYNAMOLLM_SHAPES, PLAN_LAYERS
from autoscaling.registry import make_policy
from autoscaling.splitwise.config import MachineConfig
from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.wattwise import WattwiseConfig, WattwisePolicy
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from batching.hook_chains import AdmissionChain, ClockChain, PreemptionChain
from core.arrival_rates import RATE_WINDOW_S
from core.classes import LengthClassConfig
from core.overheads import OverheadTable
from core.plan import ClusterPlan
from core.plan_ownership import PlanConflict, compose
from core.request import Request
from core.slo import SLO
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.profile_builder import build_profile
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig
from sim.config import SimConfig
from sim.scenario import build
from sim.simulator import Simulator
from sim.workload import load_trace, window

POOLS = {"pool-short": ["SS", "SM", "SL"], "pool-medium": ["MS", "MM", "ML"], "pool-long": ["LS", "LM", "LL"]}
LENGTHS = LengthClassConfig()


class Admit:
    def __init__(self, answer: bool) -> None:
        self.answer, self.asked = answer, 0

    def admit(self, seq, batcher, now_s):
        self.asked += 1
        return self.answer


class FixedClock:
    def __init__(self, clock: float | None) -> None:
        self.clock = clock

    def choose_clock_mhz(self, batcher, now_s):
        return self.clock

    def lowest_clock_mhz(self, batcher):
        return 0.0


class Victim:
    def __init__(self, index: int | None) -> None:
        self.index = index

    def victim(self, seq, batcher, now_s):
        return self.index


def _request(rid: str, prompt: int = 100, out: int = 4, arrival_s: float = 0.0) -> Request:
    return Request(request_id=rid, prompt_tokens=prompt, max_tokens=out, length_class="SS",
                   slo=SLO(ttft_s=1.0, tbt_s=0.1), arrival_s=arrival_s)


def test_admission_chain_needs_every_member_and_stops_at_the_first_refusal() -> None:
    first, refuse, last = Admit(True), Admit(False), Admit(True)
    assert not AdmissionChain([first, refuse, last]).admit(None, None, 0.0)
    assert (first.asked, refuse.asked, last.asked) == (1, 1, 0)  # later members commit nothing
    assert AdmissionChain([Admit(True), Admit(True)]).admit(None, None, 0.0)


def test_preemption_chain_takes_the_first_victim() -> None:
    assert PreemptionChain([Victim(None), Victim(2), Victim(0)]).victim(None, None, 0.0) == 2
    assert PreemptionChain([Victim(None)]).victim(None, None, 0.0) is None


def test_clock_hook_is_searched_inside_the_planners_band() -> None:
    perf = default_perf_model("llama2-70b", "h100-80gb")
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=8), clock_policy=ClockChain([FixedClock(None),
                                                                                                 FixedClock(900.0)]))
    batcher.set_clock_band(1400, 1800)
    batcher.add(_request("a"), 0.0)
    batcher.plan_step(0.0)
    assert batcher.clock_mhz == 1400  # the hook asked for 900: the floor bounds it
    batcher.clock_policy = FixedClock(1980.0)
    batcher.plan_step(1.0)
    assert batcher.clock_mhz == 1800


def test_without_a_clock_hook_a_band_runs_at_its_floor() -> None:
    batcher = ContinuousBatcher(default_perf_model("llama2-70b", "h100-80gb"), BatcherConfig(tensor_parallel=8))
    batcher.set_clock_band(1200, 1980)
    assert batcher.clock_mhz == 1200
    with pytest.raises(ValueError, match="empty"):
        batcher.set_clock_band(1500, 1400)


def test_a_plan_entry_written_by_two_layers_is_an_error() -> None:
    planner = ClusterPlan(replicas={"pool-short": 2}, clock_band_mhz={"pool-short": (1200, 1980)})
    chiron = ClusterPlan(batch_limit={"pool-short": 32}, replicas={"pool-batch": 1})
    plan = compose({"dynamollm": planner, "chiron": chiron})
    assert plan.replicas == {"pool-short": 2, "pool-batch": 1} and plan.batch_limit == {"pool-short": 32}
    with pytest.raises(PlanConflict, match=r"replicas\['pool-short'\].*'dynamollm'.*'chiron'"):
        compose({"dynamollm": planner, "chiron": ClusterPlan(replicas={"pool-short": 3})})


def test_modelled_engine_chains_throttllem_and_splitwise_hooks_instead_of_replacing_one() -> None:
    engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8, throttllem=ThrottllemConfig(length_error=0.0),
                                       splitwise=MachineConfig(phase="token")))  # token homes: their KV budget
    assert isinstance(engine.batcher.admission, AdmissionChain)
    assert len(engine.batcher.admission.members) == 2
    assert engine.batcher.clock_policy is not None


@pytest.fixture(scope="module")
def profile():
    return build_profile(default_perf_model("llama2-70b", "h100-80gb"))


@pytest.mark.parametrize("rates", [{"MS": 0.3, "MM": 0.2}, {"MS": 2.0, "MM": 1.5, "ML": 0.5}, {"LL": 1.5, "LS": 1.0}])
def test_planner_never_loses_to_a_baseline_shape_it_could_have_chosen(profile, rates) -> None:
    """ScaleShard's choices (any TP at max clock), ScaleFreq's (TP8 at any clock) and
    ScaleInst's (TP8, max clock, any count) are all in the planner's search."""
    best = cheapest_shape(profile, rates, LENGTHS, 0.8, 1, 96)
    assert best is not None
    top = max(profile.clocks_mhz)
    baseline_shapes = {(tp, top) for tp in profile.tensor_parallel_degrees} | {(8, c) for c in profile.clocks_mhz}
    for tp, clock in baseline_shapes:
        need = needed_instances(profile, rates, tp, clock, LENGTHS, 0.8)
        if need is None:
            continue
        n = max(int(np.ceil(need - 1e-9)), 1)
        assert best.power_w <= shape_power_w(profile, rates, tp, clock, n) + 1e-6


def _view(rates: dict[str, float], tp: int = 8, replicas: int = 2, min_replicas: int = 1) -> ClusterView:
    deps = {}
    for name, classes in POOLS.items():
        stats = ReplicaStats(tensor_parallel=tp, class_rates_per_s={c: rates.get(c, 0.0) for c in classes})
        deps[name] = DeploymentView(name, replicas, replicas, min_replicas, 64, (stats,) * replicas)
    return ClusterView(deps)


def test_partitions_are_every_run_of_neighbours_served_by_its_last_pool() -> None:
    found = {tuple(g.members for g in p) for p in partitions(["s", "m", "l"])}
    assert found == {(("s",), ("m",), ("l",)), (("s", "m"), ("l",)), (("s",), ("m", "l")), (("s", "m", "l"),)}
    assert all(g.host == g.members[-1] for p in partitions(["s", "m", "l"]) for g in p)
    assert sum(1 for _ in partitions(list("abcde"))) == 16


def _priced(watts: dict[tuple[str, ...], float], gpus: dict[tuple[str, ...], int] | None = None,
            held_gpu_w: float = 0.0):
    """A folding's `shape_of`: each group a TP2 shape of those watts (one instance, or its GPUs / 2),
    each GPU worth `held_gpu_w`."""
    return lambda g: PoolShape(2, (gpus or {}).get(g.members, 2) // 2, 1980, watts[g.members], held_gpu_w)


def test_folding_changes_only_on_an_epoch_and_only_when_the_saving_pays_a_restart() -> None:
    folding = PoolFolding(["s", "l"], reconfigure_cost_s=30.0, pool_epoch_s=300.0)
    merged_w = {("s",): 500.0, ("l",): 500.0, ("s", "l"): 600.0}
    assert folding.choose(_priced(merged_w), epoch=False) == folding.groups
    assert [g.members for g in folding.groups] == [("s",), ("l",)]
    # Saves 400 W x 300 s = 120 kJ against a 30 s restart at 600 W = 18 kJ: folds.
    assert [g.members for g in folding.choose(_priced(merged_w), epoch=True)] == [("s", "l")]
    assert folding.groups[0].host == "l"
    # Splitting back would save 5 W x 300 s = 1.5 kJ, less than the restart's ~18 kJ: stays.
    barely = {("s",): 297.0, ("l",): 298.0, ("s", "l"): 600.0}
    assert [g.members for g in folding.choose(_priced(barely), epoch=True)] == [("s", "l")]


def test_a_fold_that_gives_back_gpus_at_a_few_more_watts_pays_only_where_gpus_are_worth_watts() -> None:
    """Shapes priced with a GPU's worth (`PoolShape.held_gpu_w`) fold to hold fewer GPUs; the
    restart still costs only its joules."""
    watts = {("s",): 500.0, ("l",): 500.0, ("s", "l"): 1050.0}  # 50 W more on 2 GPUs fewer
    gpus = {("s",): 2, ("l",): 2, ("s", "l"): 2}
    power_only = PoolFolding(["s", "l"], reconfigure_cost_s=30.0, pool_epoch_s=300.0)
    assert [g.members for g in power_only.choose(_priced(watts, gpus), epoch=True)] == [("s",), ("l",)]
    # 2 GPUs x 200 W - 50 W = 350 W x 300 s = 105 kJ against 30 s x 1,050 W = 31.5 kJ: folds.
    weighed = PoolFolding(["s", "l"], reconfigure_cost_s=30.0, pool_epoch_s=300.0)
    assert [g.members for g in weighed.choose(_priced(watts, gpus, 200.0), epoch=True)] == [("s", "l")]
    # A 90 s restart burns 94.5 kJ, less than the 105 kJ saved: folds (the GPUs' worth over the
    # restart, 90 s x 400 W more, is not charged: the new replicas start while the old ones serve).
    slow = PoolFolding(["s", "l"], reconfigure_cost_s=90.0, pool_epoch_s=300.0)
    assert [g.members for g in slow.choose(_priced(watts, gpus, 200.0), epoch=True)] == [("s", "l")]


def test_a_held_gpu_is_worth_a_few_watts_to_the_planner(profile) -> None:
    """Power alone holds seven TP4 replicas at 1,200 MHz for 40 long prompts a second to save
    58 W over six at 1,600; `held_gpu_w` gives the GPUs back."""
    rates = {"LM": 40.0}
    power_only = cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96, ttft_headroom=0.6)
    weighed = cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96, ttft_headroom=0.6, held_gpu_w=200.0)
    assert power_only is not None and weighed is not None

    def gpus(shape: PoolShape) -> int:
        return shape.tensor_parallel * shape.instances

    assert gpus(weighed) < gpus(power_only)
    assert power_only.power_w < weighed.power_w < power_only.power_w + 200.0 * (gpus(power_only) - gpus(weighed))
    # Worth its watts to a steady pool only: a bursty pool's clock headroom absorbs its bursts.
    planner = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    assert planner.gpu_worth_w(["p"], 0.0) == ShapePlannerConfig().tuning.held_gpu_w == 200.0
    planner.planning_rates("p", {"LM": 0.0}, 0.0, 0.0)
    for t in range(150, 300, 5):  # on/off: 20 req/s every other minute, past the warm-up
        planner.planning_rates("p", {"LM": 20.0 if t // 60 % 2 else 0.0}, 0.0, float(t))
    assert planner.is_bursty("p", 300.0) and planner.gpu_worth_w(["p"], 300.0) == 0.0


def test_mixed_classes_on_one_replica_cost_their_utilisation_not_a_busy_gpu_each(profile) -> None:
    """One class alone is its own power curve; two classes on one replica cost less than
    two replicas each running one of them (the idle power is paid once)."""
    top = profile.max_rate_per_s("SM", 2, 1400)
    alone_w = shape_power_w(profile, {"SM": top / 2}, 2, 1400, 1)
    assert alone_w == pytest.approx(profile.at("SM", 2, 1400, top / 2)[0])
    other = profile.max_rate_per_s("MM", 2, 1400)
    both_w = shape_power_w(profile, {"SM": top / 4, "MM": other / 4}, 2, 1400, 1)
    apart_w = (shape_power_w(profile, {"SM": top / 4}, 2, 1400, 1)
               + shape_power_w(profile, {"MM": other / 4}, 2, 1400, 1))
    assert both_w < apart_w
    assert both_w <= max(alone_w, shape_power_w(profile, {"MM": other / 2}, 2, 1400, 1)) + 1e-6


def _tuned(**changes) -> ShapePlannerConfig:
    """The planner's config with some of its trace-tuned constants changed."""
    return ShapePlannerConfig(tuning=ShapePlannerTuning(**changes))


def _serving_view(rates: dict[str, float], plan: ClusterPlan | None, min_replicas: int = 0,
                  tp: dict[str, int] | None = None, step_time_ratio: float = 0.0,
                  prompt_tokens: dict[str, int] | None = None) -> ClusterView:
    """A cluster that runs `plan` (replicas and TP; TP2 before any plan, or `tp` where given),
    each class's arrivals reported by the pool the plan routes it to, its replicas' steps
    `step_time_ratio` times as long as the profile's (0: none timed yet), its prompts of
    `prompt_tokens` (per class; None: none reported)."""
    own = {c: name for name, classes in POOLS.items() for c in classes}
    deps = {}
    for name in POOLS:
        replicas = plan.replicas.get(name, 1) if plan is not None else 1
        routed = plan.routing_weights if plan is not None else {}
        served = [c for c in rates if routed.get(c, {own[c]: 1.0}) == {name: 1.0}]
        pool_tp = (tp or {}).get(name) or (plan.tensor_parallel.get(name, 2) if plan is not None else 2)
        stats = ReplicaStats(tensor_parallel=pool_tp, step_time_ratio=step_time_ratio,
                             class_rates_per_s={c: rates[c] / max(replicas, 1) for c in served},
                             class_prompt_tokens_per_s={c: rates[c] * n / max(replicas, 1)
                                                        for c, n in (prompt_tokens or {}).items() if c in served})
        deps[name] = DeploymentView(name, replicas, replicas, min_replicas, 64, (stats,) * replicas)
    return ClusterView(deps)


def _run(policy: WattwisePolicy, rates: dict[str, float], until_s: float, min_replicas: int = 0,
         tp: dict[str, int] | None = None, plan: ClusterPlan | None = None,
         step_time_ratio: float = 0.0, prompt_tokens: dict[str, int] | None = None) -> ClusterPlan:
    """Plans every plan interval against a cluster that runs each plan at once."""
    t = 0.0 if plan is None else policy._next_plan_s
    while t <= until_s:
        plan = policy.observe(_serving_view(rates, plan, min_replicas, tp, step_time_ratio, prompt_tokens), t)
        t += policy.config.plan_interval_s
    assert plan is not None
    return plan


def test_a_class_whose_prompts_run_longer_than_the_planner_was_tuned_on_gets_more_instances(profile) -> None:
    """Mooncake's long prompts (7,200 tokens where conversation's predicted LS and LM average
    2,530 and 1,765): the long pool is planned for them; prompts as long as the tuned ones, or
    within the deadband above, plan as no prompts reported; and the setting turns it off."""
    rates = {"LS": 1.5, "LM": 0.5}
    until_s = 200.0

    def long_pool(prompt_tokens: dict[str, int] | None, follow: bool = True) -> int:
        config = WattwiseConfig(pools=POOLS, planner={"follow_prompt_lengths": follow})
        plan = _run(WattwisePolicy(config, profile=profile), rates, until_s, prompt_tokens=prompt_tokens)
        return plan.replicas["pool-long"] * plan.tensor_parallel["pool-long"]

    as_profiled = long_pool(None)
    assert long_pool({"LS": 2530, "LM": 1765}) == as_profiled
    assert long_pool({"LS": 3300, "LM": 2300}) == as_profiled  # within the 35% deadband
    assert long_pool({"LS": 7200, "LM": 7200}) > as_profiled
    assert long_pool({"LS": 7200, "LM": 7200}, follow=False) == as_profiled


def test_at_low_load_short_prompts_fold_into_a_longer_pool_and_route_their_classes_there(profile) -> None:
    """Sharing replicas across pools is in the planner's search: at low load the short and
    medium pools give their replicas back and their classes go to the long pool (an LS
    prefill, 3,000 tokens, takes 127 ms at TP4; at 0.3 a second it runs under 4% of the time,
    and a short prompt that lands behind one still meets its 250 ms target); a pool whose
    min_replicas Serve must keep is never folded. Not while pools warm up: their rate windows
    fill from zero then, and a fold read from that ramp moves classes onto a pool sized for a
    load that is not the real one."""
    low = {"SS": 0.3, "MM": 0.3, "LS": 0.3}
    policy = WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile)
    warming = _run(policy, low, policy.config.planner.tuning.warmup_s - 1.0)
    assert all(warming.replicas[p] >= 1 for p in POOLS)
    # The fold is decided at the first pool epoch, at the warm-up's end (the load is steady);
    # the classes move a plan later, once the medium pool serves the shape planned for them.
    later = _run(policy, low, policy.config.planner.tuning.first_epoch_s + policy.config.plan_interval_s + 1.0,
                 plan=warming)
    folded = [p for p in POOLS if later.replicas[p] == 0]
    assert folded == ["pool-short", "pool-medium"]
    for cls in POOLS["pool-short"] + POOLS["pool-medium"]:  # routed to the pool that runs
        assert later.routing_weights[cls] == {"pool-long": 1.0}
    assert later.replicas["pool-long"] >= 1
    kept = WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile)
    pinned = _run(kept, low, kept.config.planner.tuning.first_epoch_s + kept.config.pool_epoch_s + 1.0, min_replicas=1)
    assert all(pinned.replicas[p] >= 1 for p in POOLS)
    assert pinned.routing_weights["SS"] == {"pool-short": 1.0}


def test_each_layer_writes_its_own_entries_of_a_folded_plan(profile, monkeypatch) -> None:
    """The policy's compose entries are the ownership table's plan layers, in its order; in a
    folded plan DynamoLLM's shapes write the serving pool, its folding the routes and the
    pools folded away (compose would refuse an entry two of them wrote)."""
    composed: list[dict[str, ClusterPlan]] = []

    def recording(parts: dict[str, ClusterPlan]) -> ClusterPlan:
        composed.append(dict(parts))
        return compose(parts)

    monkeypatch.setattr(wattwise_module, "compose", recording)
    low = {"SS": 0.3, "MM": 0.3, "LS": 0.3}
    policy = WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile)
    warming = _run(policy, low, policy.config.planner.tuning.warmup_s - 1.0)
    _run(policy, low, policy.config.planner.tuning.first_epoch_s + policy.config.plan_interval_s + 1.0, plan=warming)
    assert all(tuple(parts) == PLAN_LAYERS for parts in composed)
    assert set(PLAN_LAYERS) == {d.plan_layer for d in DECISIONS if d.plan_layer}
    last = composed[-1]
    assert last[DYNAMOLLM_FOLDING].replicas == {"pool-short": 0, "pool-medium": 0}
    assert last[DYNAMOLLM_FOLDING].routing_weights["SS"] == {"pool-long": 1.0}
    assert set(last[DYNAMOLLM_SHAPES].replicas) == set(last[DYNAMOLLM_SHAPES].clock_band_mhz) == {"pool-long"}


def test_pools_whose_replicas_run_off_the_profile_neither_fold_nor_change_tp(profile) -> None:
    """A fold or a TP switch is the profile's word on a shape no replica has run. Replicas
    whose steps run off the profile (here 20% longer) have shown it wrong for them, and their
    speed at one TP and class mix says little of another: engines 1.8-3.3x slower, a fold onto
    TP4 replicas that measured 2.8x where the TP2 ones had 2.1x left the pool short for 30 s."""
    low = {"SS": 0.2, "MM": 0.2, "LM": 0.2}
    until_s = WattwiseConfig(pools=POOLS).planner.tuning.first_epoch_s + WattwiseConfig(pools=POOLS).pool_epoch_s + 10.0
    as_profiled = _run(WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile), low, until_s,
                       step_time_ratio=1.0)
    assert any(as_profiled.replicas[p] == 0 for p in POOLS)  # folds, as at no measured deviation
    slow = _run(WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile), low, until_s, step_time_ratio=1.2)
    assert all(slow.replicas[p] >= 1 for p in POOLS)
    assert all(slow.routing_weights.get(c, {own: 1.0}) == {own: 1.0} for own, classes in POOLS.items()
               for c in classes)
    rates, running, off = {"LL": 4.0}, PoolShape(2, 2, 1980, math.inf), Dilation(1.2)

    def planner() -> PoolShapePlanner:
        return PoolShapePlanner(profile, _tuned(first_epoch_s=0.0), LENGTHS, 33.0, 300.0)

    switch, same_tp = planner().cheapest(rates, 96, dilation=off), planner().cheapest(rates, 96, tps=[2], dilation=off)
    assert switch is not None and same_tp is not None
    # The profile's word: TP4, saving more over an epoch than the restart burns.
    assert switch.tensor_parallel == 4
    assert worth_reconfiguring(same_tp.power_w, switch.power_w, 300.0, 33.0 * switch.power_w)
    kept = planner().plan("p", rates, 96, 0, running, 0.0, dilation=off)
    assert kept.tensor_parallel == 2 and kept.instances >= 2


def test_a_pool_that_must_grow_starts_the_cheaper_tps_instances_without_waiting_for_an_epoch(profile) -> None:
    """Growing at the old TP and re-sharding at the next epoch holds both shapes' GPUs in
    between (the conversation trace's peak: two TP4 replicas for 160 s, then three TP2). The
    instances start anyway, so they start at the cheaper TP; without one to start, a switch
    still waits for an epoch; before the first, the operator's TP stands; and replicas off the
    profile keep their TP."""
    running = PoolShape(tensor_parallel=4, instances=1, clock_mhz=max(profile.clocks_mhz), power_w=math.inf)

    def between_epochs() -> PoolShapePlanner:
        planner = PoolShapePlanner(profile, _tuned(first_epoch_s=0.0), LENGTHS,
                                   reconfigure_cost_s=33.0, pool_epoch_s=300.0)
        assert planner.at_epoch(0.0)
        planner.end_epoch(0.0)  # the next one is 300 s away
        return planner

    assert between_epochs().cheapest({"LM": 8.0}, 96, tps=[4]).instances == 2  # TP4 would grow to two
    grown = between_epochs().plan("p", {"LM": 8.0}, 96, 0, running, 10.0)
    assert (grown.tensor_parallel, grown.instances) == (2, 3)
    # At 2 LM/s one TP2 replica (1,343 W with its GPUs' worth) is cheaper than the TP4 one
    # running (2,409 W), but that one carries the load:
    assert between_epochs().cheapest({"LM": 2.0}, 96, held_gpu_w=200.0).tensor_parallel == 2
    assert between_epochs().cheapest({"LM": 2.0}, 96, tps=[4]).instances == 1
    kept = between_epochs().plan("p", {"LM": 2.0}, 96, 0, running, 10.0)
    assert (kept.tensor_parallel, kept.instances) == (4, 1)  # nothing to start: wait for the epoch
    off = between_epochs().plan("p", {"LM": 8.0}, 96, 0, running, 10.0, dilation=Dilation(1.2))
    assert off.tensor_parallel == 4 and off.instances >= 2
    first = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    assert first.plan("p", {"LM": 8.0}, 96, 0, running, 0.0).tensor_parallel == 4  # its first epoch: 60 s away


def test_a_folded_pools_classes_move_only_once_the_host_serves_its_planned_shape(profile) -> None:
    """Make before break: while the host still runs another TP than planned (its new engines
    starting), the folded pool keeps its replicas and its classes; they move once the host's
    replicas at the planned TP serve."""
    low = {"SS": 0.2, "MM": 0.2, "LM": 0.2}
    config = WattwiseConfig(pools=POOLS, tensor_parallel_options={"pool-long": [2]})
    policy = WattwisePolicy(config, profile=profile)
    until_s = config.planner.tuning.first_epoch_s + config.pool_epoch_s + 1.0
    held = _run(policy, low, until_s, tp={"pool-long": 4})
    assert [g.members for g in policy._folding.groups][-1][-2:] == ("pool-medium", "pool-long")  # folded...
    assert held.routing_weights["MM"] == {"pool-medium": 1.0} and held.replicas["pool-medium"] >= 1  # ...not moved
    moved = _run(policy, low, until_s + config.plan_interval_s, plan=held)
    assert moved.routing_weights["MM"] == {"pool-long": 1.0} and moved.replicas["pool-medium"] == 0


def test_a_short_prompt_sharing_a_replica_with_long_ones_has_less_ttft_to_spend(profile) -> None:
    """One long prefill may run ahead of a short prompt: together they never fill less of an
    instance than apart (more where the wait binds: the test below)."""
    apart = (needed_instances(profile, {"SS": 1.0}, 2, 1400, LENGTHS, 0.7)
             + needed_instances(profile, {"LL": 0.3}, 2, 1400, LENGTHS, 0.7))
    together = needed_instances(profile, {"SS": 1.0, "LL": 0.3}, 2, 1400, LENGTHS, 0.7)
    assert together is None or together >= apart


def test_prompts_in_deadline_order_wait_half_a_step_behind_a_class_due_later(profile) -> None:
    """Where replicas prefill by TTFT deadline in steps of at most 0.1 s, a short prompt waits
    for the step in flight behind a long one (half a step on average), not its whole prefill:
    short and long prompts then share a replica where in arrival order they cannot."""
    rates = {"SS": 1.0, "LS": 0.3}
    arrival = needed_instances(profile, rates, 2, 1400, LENGTHS, 0.7, 0.6)
    deadline = needed_instances(profile, rates, 2, 1400, LENGTHS, 0.7, 0.6, deadline_step_s=0.1)
    assert deadline is not None and (arrival is None or deadline < arrival)
    # The class due first still waits out a prefill due as soon as its own.
    assert (needed_instances(profile, {"SS": 1.0, "SM": 0.5}, 2, 1400, LENGTHS, 0.7, 0.6, deadline_step_s=0.1)
            == needed_instances(profile, {"SS": 1.0, "SM": 0.5}, 2, 1400, LENGTHS, 0.7, 0.6))


def test_a_rare_long_prompt_costs_its_share_of_the_time_not_a_whole_prefill_for_everyone() -> None:
    """A medium prompt waits behind another prefill only if it lands while one runs. On
    Splitwise's profile (slow prefills) an ML prompt a second every ten makes medium prompts
    wait rarely: sharing costs no more than the loads apart (cutting every prompt's target by a
    whole ML prefill made the pair unservable at TP4 below the top clock). LS prompts
    (400 ms prefills) at 1 a second make one medium prompt in ten wait, and that one misses its
    400 ms target whatever the instance count: the pair cannot share."""
    profile = build_profile(default_perf_model("llama2-70b", "h100-80gb", "splitwise-llama2-70b-h100"))
    rare = {"MM": 1.5, "ML": 0.1}
    shared = needed_instances(profile, rare, 4, 1400, LENGTHS, 0.7, 0.6)
    apart = needed_instances(profile, rare, 4, 1400, LENGTHS, 0.7, 0.6, cross_class_wait=False)
    assert shared is not None and apart is not None and shared < 1.1 * apart
    busy = {"MM": 1.5, "LS": 1.0}
    assert needed_instances(profile, busy, 4, 1400, LENGTHS, 0.7, 0.6, cross_class_wait=False) is not None
    assert needed_instances(profile, busy, 4, 1400, LENGTHS, 0.7, 0.6) is None


def test_replicas_picking_each_steps_clock_are_priced_at_the_clock_they_run(profile) -> None:
    """A shape is sized for the margined peak at its clock (one TP2 replica at 1,200 MHz for
    2 MM and 1 LM requests a second). Replicas that pick each step's clock run at the lowest
    clock that carries the load without the margin (800 MHz here), or at their search's floor
    where that is higher (throttLL'eM's least-energy clock, 1,505 MHz), and are priced at the
    power the profile shows there: 974 W, or 1,022 W between 1,400 and 1,600 MHz's, above
    the 981 W of the clock that sized them."""
    rates = {"MM": 2.0, "LM": 1.0}
    sized = cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96)
    load = {cls: r / 1.25 for cls, r in rates.items()}
    lowest = cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96, load_rates=load)
    floored = cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96, load_rates=load, clock_floor_mhz=1505.0)
    assert sized is not None and lowest is not None and floored is not None
    tp, n = sized.tensor_parallel, sized.instances
    assert (lowest.tensor_parallel, lowest.instances, floored.tensor_parallel, floored.instances) == (tp, n, tp, n)
    carries = [c for c in sorted(profile.clocks_mhz)
               if (need := needed_instances(profile, load, tp, c, LENGTHS, 0.7, cross_class_wait=False)) is not None
               and need <= n]
    assert carries[0] < sized.clock_mhz
    assert lowest.power_w == pytest.approx(shape_power_w(profile, load, tp, carries[0], n))

    def at(clock: int) -> float:
        return shape_power_w(profile, load, tp, clock, n)

    assert at(1400) < floored.power_w < at(1600)
    assert floored.power_w > at(sized.clock_mhz) > lowest.power_w
    # A floor below the clock the load needs changes nothing.
    assert cheapest_shape(profile, rates, LENGTHS, 0.7, 1, 96, load_rates=load,
                          clock_floor_mhz=float(carries[0])).power_w == pytest.approx(lowest.power_w)


def test_a_replica_reports_the_floor_of_its_clock_search_and_the_planner_prices_no_lower(profile) -> None:
    """throttLL'eM's per-step clock stops at the least-energy decode clock (1,505 MHz on H100,
    ThrottllemConfig.energy_floor); the replica reports it, and a pool of such replicas is
    priced at it where its load needs less."""
    def reported(energy_floor: bool) -> float:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=2, throttllem=ThrottllemConfig(
            length_error=0.0, energy_floor=energy_floor)))
        return engine.batcher.stats(0.0).step_clock_floor_mhz

    floor = reported(True)
    assert 1400 < floor < 1600 and reported(False) == 0.0

    def priced_w(floor_mhz: float) -> float:
        policy = WattwisePolicy(WattwiseConfig(pools={"pool-medium": POOLS["pool-medium"]}, fold_pools=False,
                                               tensor_parallel_options={"pool-medium": [2]}), profile=profile)
        stats = ReplicaStats(tensor_parallel=2, per_step_clock=True, step_clock_floor_mhz=floor_mhz,
                             class_rates_per_s={"MM": 2.0})
        policy.observe(ClusterView({"pool-medium": DeploymentView("pool-medium", 1, 1, 1, 64, (stats,))}), 0.0)
        shape = policy.planner.shape("pool-medium")
        assert shape is not None
        return shape.power_w

    assert priced_w(floor) > priced_w(0.0)


def test_the_planners_profile_keeps_a_kv_budget_for_admission(profile) -> None:
    """A KV-bound class (long prompts at TP2) is planned to fill at most kv_budget of the
    replica's KV: throttLL'eM's admission reserves each request's projected peak."""
    assert ShapePlannerConfig().kv_budget < 1.0
    policy = WattwisePolicy(WattwiseConfig(pools=POOLS))
    assert policy.profile.max_rate_per_s("LM", 2, 1980) < profile.max_rate_per_s("LM", 2, 1980)
    # TP4 holds about ten times TP2's KV (the weights take less of it): bound by time, unchanged.
    assert policy.profile.max_rate_per_s("LM", 4, 1980) == pytest.approx(profile.max_rate_per_s("LM", 4, 1980))


def test_a_class_moves_to_a_pool_only_once_it_is_ready() -> None:
    moves = RouteHandover()
    assert moves.route("SS", "pool-short", "pool-medium", target_ready=False) == "pool-short"
    assert moves.route("SS", "pool-short", "pool-medium", target_ready=True) == "pool-medium"
    assert moves.route("SS", "pool-short", "pool-short", target_ready=False) == "pool-medium"  # back: same rule
    assert moves.route("SS", "pool-short", "pool-short", target_ready=True) == "pool-short"
    assert moves.route("MM", "pool-medium", "pool-medium", target_ready=False) == "pool-medium"


def test_replicas_over_their_ttft_target_earn_one_instance_beyond_the_forecast_not_one_per_plan(profile) -> None:
    """Latency the profile does not model (a slow serving stack, a busy CPU) gets one more
    instance; replicas that stay late must not add another each plan."""
    policy = WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile)
    rates = {"SS": 0.5}
    forecast = policy.observe(_view(rates, replicas=1), 0.0).replicas["pool-short"]

    def late_view(replicas: int) -> ClusterView:
        view = _view(rates, replicas=replicas)
        short = view.deployments["pool-short"]
        late = replace(short.replica_stats[0], ttft_ewma_s=LENGTHS.slo("SS").ttft_s * 3)
        view.deployments["pool-short"] = replace(short, replica_stats=(late,) * replicas)
        return view

    running, now_s = forecast, 0.0
    for _ in range(6):  # each plan finds the previous one's replicas running and still late
        now_s += policy.config.plan_interval_s
        plan = policy.observe(late_view(running), now_s)
        running = plan.replicas["pool-short"]
    assert running == forecast + 1
    assert plan.late_ttft_s == {"pool-short": LENGTHS.slo("SS").ttft_s * 3}  # the catch-up entry says why


def test_a_backlog_beyond_the_forecast_is_a_floor_on_instances_the_plan_names(profile) -> None:
    """Requests waiting beyond what the replicas hold (a burst the rate forecast missed): the
    catch-up entry asks for one instance per `overload_queue_per_replica` of them, and the
    shapes plan no fewer."""
    policy = WattwisePolicy(WattwiseConfig(pools=POOLS), profile=profile)
    rates = {"SS": 0.5}
    forecast = policy.observe(_view(rates, replicas=1), 0.0).replicas["pool-short"]
    view = _view(rates, replicas=1)
    short = view.deployments["pool-short"]
    waiting = int(policy.config.overload_queue_per_replica) * (forecast + 3)
    view.deployments["pool-short"] = replace(short, queued_outside=waiting)
    plan = policy.observe(view, policy.config.plan_interval_s)
    assert plan.backlog_instances == {"pool-short": forecast + 3}
    assert plan.replicas["pool-short"] == forecast + 3


def test_while_instances_start_the_serving_replicas_run_at_the_clock_the_load_needs(profile) -> None:
    """A plan for more instances than are ready: the clock band's floor is what the ready
    replicas need to carry the load meanwhile (here: all they have), and the planned clock
    once the new instances serve."""
    config = WattwiseConfig(pools=POOLS, fold_pools=False, tensor_parallel_options={"pool-short": [8]})
    policy = WattwisePolicy(config, profile=profile)
    rates = {"SS": 80.0}
    short = policy.observe(_view(rates, replicas=1), 0.0)
    planned = short.replicas["pool-short"]
    top = max(profile.clocks_mhz)
    assert planned > 1 and short.clock_band_mhz["pool-short"] == (top, top)
    each = {cls: rate / planned for cls, rate in rates.items()}  # replicas report their own arrivals
    served = policy.observe(_view(each, replicas=planned), policy.config.plan_interval_s)
    assert served.replicas["pool-short"] == planned
    floor, ceiling = served.clock_band_mhz["pool-short"]
    assert floor < top == ceiling
    assert floor == policy.planner.shape("pool-short").clock_mhz  # the planned clock again


def test_a_steady_pool_whose_replicas_pick_each_steps_clock_gets_the_least_power_floor(profile) -> None:
    """The planned clock sizes instances for the margined peak; replicas whose per-step search
    sees every deadline may run below it, down to the least-power clock that carries the load
    (below the roofline's knee a lower clock costs more). Replicas that run at the floor (vLLM
    here), a bursty pool, a pool with batch requests waiting, or the setting off keep the
    planned clock as the floor; batch work that runs as it arrives does not."""
    config = WattwiseConfig(pools={"pool-short": POOLS["pool-short"]}, fold_pools=False,
                            tensor_parallel_options={"pool-short": [8]})
    load = {"SS": 40.0}
    shape = cheapest_shape(profile, {"SS": 40.0 * 1.25}, LENGTHS, config.planner.tuning.headroom, 1, 96, tps=[8],
                           ttft_headroom=config.planner.tuning.ttft_headroom, load_rates=load)
    assert shape is not None
    carrying = [c for c in profile.clocks_mhz
                if (n := needed_instances(profile, load, 8, c, LENGTHS, config.planner.tuning.headroom,
                                          config.planner.tuning.ttft_headroom, cross_class_wait=False)) is not None
                and n <= shape.instances]
    lowest = shape.run_clock_mhz
    assert lowest == min(carrying, key=lambda c: shape_power_w(profile, load, 8, c, shape.instances))
    assert lowest > min(carrying)  # the lowest clock that carries the load draws more (1,200 vs 1,000 MHz)

    def floor_after(per_step_clock: bool, rate_at, config: WattwiseConfig, end_s: float = 600.0,
                    batch_rate_per_s: float = 0.0, batch_waiting: int = 0) -> float:
        policy = WattwisePolicy(config, profile=profile)
        t, plan = 0.0, None
        while t <= end_s:
            stats = ReplicaStats(tensor_parallel=8, per_step_clock=per_step_clock, class_rates_per_s={"SS": rate_at(t)},
                                 batch_rate_per_s=batch_rate_per_s, queued_requests=batch_waiting,
                                 batch_waiting=batch_waiting)
            view = ClusterView({"pool-short": DeploymentView("pool-short", 1, 1, 1, 64, (stats,))})
            plan = policy.observe(view, t)
            t += policy.config.plan_interval_s
        assert plan is not None
        return plan.clock_band_mhz["pool-short"][0]

    steady = lambda t: 40.0  # noqa: E731
    bursty = lambda t: 40.0 if t % 120.0 < 20.0 else 0.0  # noqa: E731
    assert floor_after(True, steady, config) == lowest
    planned = floor_after(False, steady, config)  # sized for the margined peak: 1,600 MHz here
    assert planned != lowest and planned in profile.clocks_mhz
    assert floor_after(True, steady, config.model_copy(update={"lowest_floor_when_steady": False})) == planned
    assert floor_after(True, bursty, config) != lowest
    assert floor_after(True, steady, config, batch_rate_per_s=2.0) == lowest  # batch work served as it comes
    assert floor_after(True, steady, config, batch_rate_per_s=2.0, batch_waiting=4) == planned  # it fills batches


def test_replica_stats_survive_serves_flat_metrics() -> None:
    stats = ReplicaStats(queued_requests=3, clock_mhz=1410.0, per_step_clock=True, class_rates_per_s={"SS": 1.5})
    assert ReplicaStats.from_metrics(stats.to_metrics()) == stats


def test_a_bursty_pool_keeps_its_peak_between_bursts_and_a_steady_one_forgets_it(profile) -> None:
    """On/off traffic (the code trace: bursts of ~30 req/s minutes apart) is planned at the
    peak of the last `bursty_lookback_s`, so the next burst finds the instances the last one
    needed; a steady pool that peaked plans for its recent rate once `lookback_s` has passed."""
    config = ShapePlannerConfig()
    margin = 1.0 + config.tuning.burst_margin

    def planned_after(rate_at, end_s: float = 600.0) -> float:
        planner = PoolShapePlanner(profile, config, LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
        t, planned = 0.0, 0.0
        while t <= end_s:
            planned = planner.planning_rates("pool-long", {"LM": rate_at(t)}, 0.0, t)["LM"]
            t += 5.0
        return planned

    def bursty(t: float) -> float:  # 20 s bursts every 120 s, then quiet from t = 360 s
        return 30.0 if t < 360.0 and t % 120.0 < 20.0 else 0.0

    def steady(t: float) -> float:  # 10 req/s, 14 req/s for a minute at t = 300 s, then 10 again
        return 14.0 if 300.0 <= t < 360.0 else 10.0

    def bursts_then_dense(t: float) -> float:  # as bursty, then 20 req/s from t = 300 s on
        return bursty(t) if t < 300.0 else 20.0

    assert planned_after(bursty) == pytest.approx(30.0 * margin)
    assert planned_after(steady) == pytest.approx(10.0 * margin)
    # At 1,000 s the last 900 s no longer vary enough to be bursty, but the pool was bursty
    # within them (the code trace's bursts closing up, then spreading out again): it keeps
    # the peak of the whole window until a window has passed since it last was.
    assert planned_after(bursts_then_dense, end_s=1000.0) == pytest.approx(30.0 * margin)
    # Then it plans at its recent peak, and, steady for a window with its rate never above
    # that peak, without a margin (`margin_from_history`).
    assert planned_after(bursts_then_dense, end_s=1500.0) == pytest.approx(20.0)


def test_classes_and_pools_served_together_are_planned_at_the_peak_of_their_sum(profile) -> None:
    """Each class's arrivals come independently, so their windows do not peak together: two
    classes taking turns at 3 and 1 requests/s (4 in all, always) plan for 4, split by their
    shares over the window, not for 3 + 3. The same holds for two pools a host would serve,
    while each pool alone plans for its own peak."""
    config = ShapePlannerConfig(tuning=ShapePlannerTuning(margin_from_history=False, burst_margin=0.0))
    planner = PoolShapePlanner(profile, config, LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    planned: dict[str, float] = {}
    for step in range(48):  # 240 s of plans, the classes swapping every 10 s
        high, low = (3.0, 1.0) if step // 2 % 2 else (1.0, 3.0)
        planned = planner.planning_rates("pool-medium", {"MS": high, "MM": low}, 0.0, step * 5.0)
        planner.planning_rates("pool-long", {"LS": high, "LM": low}, 0.0, step * 5.0)
    assert sum(planned.values()) == pytest.approx(4.0)
    assert planned["MS"] == pytest.approx(2.0, rel=0.1)
    together = planner.group_rates(("pool-medium", "pool-long"), 235.0)
    assert sum(together.values()) == pytest.approx(8.0)
    assert planner.group_rates(("pool-long",), 235.0) == pytest.approx(
        {cls: r for cls, r in together.items() if cls in ("LS", "LM")})


def test_a_bursty_pool_served_with_a_steady_one_keeps_its_long_window_to_itself(profile) -> None:
    """A bursty pool is planned at its long window's peak; a steady pool folded with it is
    still planned at its own recent peak (10 requests/s fell to 4 five minutes ago), not
    at the long window's."""
    config = ShapePlannerConfig()
    margin = 1.0 + config.tuning.burst_margin
    planner = PoolShapePlanner(profile, config, LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    t = 0.0
    while t <= 600.0:
        planner.planning_rates("pool-short", {"SS": 30.0 if t % 120.0 < 20.0 else 0.0}, 0.0, t)
        planner.planning_rates("pool-long", {"LM": 10.0 if t < 300.0 else 4.0}, 0.0, t)
        t += 5.0
    assert planner.is_bursty("pool-short", 600.0) and not planner.is_bursty("pool-long", 600.0)
    together = planner.group_rates(("pool-short", "pool-long"), 600.0)
    assert together["LM"] == pytest.approx(4.0 * margin)
    assert together["SS"] == pytest.approx(30.0 * margin)


def test_pools_served_together_plan_for_the_rises_of_their_sum(profile) -> None:
    """A pool whose rate jumps above its trailing peak plans the whole margin; a second pool
    dipping at the same moments leaves their sum flat, so served together they plan none."""
    planner = PoolShapePlanner(profile, ShapePlannerConfig(), LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
    t = 0.0
    while t <= 1200.0:
        jump = 1.0 if t % 300.0 == 0.0 else 0.0
        planner.planning_rates("pool-medium", {"MM": 2.0 + jump}, 0.0, t)
        planner.planning_rates("pool-long", {"LM": 2.0 - jump}, 0.0, t)
        t += 5.0
    assert planner.burst_margin(("pool-medium",), 1200.0) == pytest.approx(ShapePlannerTuning().burst_margin)
    assert planner.burst_margin(("pool-long",), 1200.0) == 0.0
    assert planner.burst_margin(("pool-medium", "pool-long"), 1200.0) == 0.0
    assert sum(planner.group_rates(("pool-medium", "pool-long"), 1200.0).values()) == pytest.approx(4.0)


def test_a_pool_plans_for_the_largest_rise_above_its_peak_it_showed(profile) -> None:
    """Conversation traffic drifts a few percent above its trailing peak; a fixed 25% margin
    held a third TP2 replica beside conv's TP4 for the hour's busier half. With a window of
    history a pool plans for the largest rise it showed over it (at most `burst_margin`); a
    jump keeps the whole margin for a window after it, and without the history, or with
    `margin_from_history` off, a pool plans for `burst_margin`."""
    config = ShapePlannerConfig()

    def margin_at(rate_at, end_s: float, cfg: ShapePlannerConfig = config) -> float:
        planner = PoolShapePlanner(profile, cfg, LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
        t, planned, peak = 0.0, 0.0, 0.0
        while t <= end_s:
            planned = planner.planning_rates("pool-long", {"LM": rate_at(t)}, 0.0, t)["LM"]
            peak = max(rate_at(u) for u in np.arange(max(t - cfg.tuning.lookback_s, 0.0), t + 1.0, 5.0))
            t += 5.0
        return planned / peak - 1.0

    def drifting(t: float) -> float:  # 10 req/s +- 4%, a 5-minute swing
        return 10.0 * (1.0 + 0.04 * math.sin(2 * math.pi * t / 300.0))

    def jump(t: float) -> float:  # the same, 14 req/s for a minute at t = 1,000 s
        return 14.0 if 1000.0 <= t < 1060.0 else drifting(t)

    assert margin_at(drifting, 600.0) == pytest.approx(config.tuning.burst_margin)  # not a window of history yet
    assert 0.0 < margin_at(drifting, 1200.0) < 0.02
    assert margin_at(jump, 1500.0) == pytest.approx(config.tuning.burst_margin)  # 40% over its peak, capped
    assert margin_at(jump, 2100.0) < 0.02  # a window after the jump
    fixed = _tuned(margin_from_history=False)
    assert margin_at(drifting, 1200.0, fixed) == pytest.approx(config.tuning.burst_margin)


def test_young_pools_fold_only_on_load_that_has_shown_itself_steady(profile) -> None:
    """Two minutes of conversation traffic vary 0.1-0.3 (std over mean); the coding trace's
    on/off minutes 0.7-0.9 before its 15-minute window calls them bursty, and the pools it
    folded at the warm-up's end met 94% of one class's SLOs in the next burst. Pools one of
    which is young fold only on summed load within `young_fold_cv` after the replicas'
    rate-window ramp; with a window of history the bursty rule alone decides."""
    config = ShapePlannerConfig()
    pools = ("pool-short", "pool-medium")

    def may_fold_at(rate_at, end_s: float, cfg: ShapePlannerConfig = config) -> bool:
        planner = PoolShapePlanner(profile, cfg, LENGTHS, reconfigure_cost_s=33.0, pool_epoch_s=300.0)
        t = 0.0
        while t <= end_s:
            ramp = min(t / RATE_WINDOW_S, 1.0)  # the replicas' rate windows fill from zero
            for pool, share in zip(pools, (0.3, 0.7), strict=True):
                planner.planning_rates(pool, {"MM": ramp * share * rate_at(t)}, 0.0, t)
            t += 5.0
        return planner.may_newly_fold(pools, end_s)

    def steady(t: float) -> float:  # 4 req/s +- 10%
        return 4.0 * (1.0 + 0.1 * math.sin(2 * math.pi * t / 60.0))

    def on_off(t: float) -> float:  # 3 req/s for 20 s in every 40, 0.75 in between: CV 0.6
        return 3.0 if t % 40.0 < 20.0 else 0.75

    assert may_fold_at(steady, 121.0)
    assert not may_fold_at(on_off, 121.0)
    assert not may_fold_at(lambda t: 0.0, 121.0)  # silence shows nothing
    assert may_fold_at(on_off, 121.0, _tuned(young_fold_cv=None))
    assert may_fold_at(on_off, config.tuning.bursty_lookback_s + 10.0)  # under bursty_cv, and old enough


def test_a_pool_warming_up_keeps_its_instances_and_does_not_read_the_ramp_as_bursts(profile) -> None:
    """At start the replicas' 30 s arrival-rate windows fill from zero: read as load, the
    ramp looks bursty (the conversation trace's long pool kept the planned clock floor for its
    first 15 minutes) and low (pools shrank before the load had been seen, and the coding
    trace's first burst met one replica). For `warmup_s` a pool does neither."""
    config = ShapePlannerConfig()
    start = PoolShape(tensor_parallel=2, instances=3, clock_mhz=max(profile.clocks_mhz), power_w=math.inf)
    light = 0.2  # req/s of LM that one TP2 instance carries

    def after(end_s: float, warmup_s: float) -> tuple[int, bool]:
        planner = PoolShapePlanner(profile, _tuned(warmup_s=warmup_s), LENGTHS,
                                   reconfigure_cost_s=33.0, pool_epoch_s=300.0)
        t, shape = 0.0, start
        while t <= end_s:
            filled = min(max(t - 12.0, 0.0) / 30.0, 1.0)  # the first request comes 12 s in
            planned = planner.planning_rates("pool-long", {"LM": light * filled}, 0.0, t)
            shape = planner.plan("pool-long", planned, 96, 0, start, t, tps=[2])
            t += 5.0
        return shape.instances, planner.is_bursty("pool-long", t)

    assert after(110.0, config.tuning.warmup_s) == (3, False)
    assert after(110.0, 0.0) == (1, True)  # without a warm-up: the ramp is a burst, the pool shrinks at 90 s
    assert after(400.0, config.tuning.warmup_s) == (1, False)  # then it follows the load it has seen


def test_planner_simulator_and_serve_engine_share_one_overhead_table() -> None:
    table = OverheadTable()
    policy = make_policy("wattwise", pools=POOLS)
    assert policy.planner.reconfigure_cost_s == table.reshard_s
    assert SimConfig().overheads == table == ModelledEngineConfig().overheads


def test_serve_modelled_engine_pays_a_tp_change_like_the_simulator() -> None:
    """The new-TP engine starts beside the old one for the table's re-shard time (the
    old one serves meanwhile), its idle GPUs are charged, then it takes over."""
    startup_s = 5.0

    async def change() -> tuple[int, int, int, float]:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8, overheads=OverheadTable(reshard_s=startup_s)))
        engine.set_tensor_parallel(2)
        before = engine.stats()
        async for _ in engine.generate(_request("r", out=2, arrival_s=time.time())):
            break  # served at once by the old engine
        during = engine.stats().tensor_parallel
        deadline = time.monotonic() + 60
        while engine.stats().tensor_parallel != 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        after = engine.stats()
        await engine.shutdown()
        return before.tensor_parallel, during, after.tensor_parallel, after.energy_j - before.energy_j

    before, during, after, energy_j = asyncio.run(change())
    assert (before, during, after) == (8, 8, 2)
    perf = default_perf_model("llama2-70b", "h100-80gb")
    assert energy_j >= perf.idle_power_w(2) * startup_s  # the starting engine's GPUs were paid for


def test_simulator_classifies_with_the_predictors_error_by_default() -> None:
    w = window(load_trace("conv"), 0, 60)
    config = SimConfig()
    assert config.length_prediction == "predictor"
    setups, policy = build("singlepool", w, config)
    predicted = Simulator(w, policy, setups, config).predicted
    assert (predicted != w.output_tokens).mean() > 0.5  # predictions, not the true lengths
    oracle = Simulator(w, policy, setups, SimConfig(length_prediction="oracle")).predicted
    assert np.array_equal(oracle, w.output_tokens)


def test_both_runtimes_chunk_prefill_to_the_tightest_tbt_target_in_ttft_deadline_order() -> None:
    """The composite's simulated replicas and the shipped app's engines bound each step by
    the same TBT target (batching.step_budget) and prefill in the same order (TTFT deadline),
    so a step the simulator charges is one the Serve replica takes."""
    import yaml

    from app.config import AppConfig
    from core.paths import SERVE_CONFIG

    tbt_s = min(LengthClassConfig().slo(c).tbt_s for c in LengthClassConfig.names())
    setups, _ = build("wattwise", window(load_trace("conv"), 0, 10), SimConfig())
    assert {s.step_time_target_s for s in setups} == {tbt_s}
    args = yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]
    assert {p.engine.step_time_target_s for p in AppConfig.model_validate(args).pools} == {tbt_s}
    assert {s.prefill_by_ttft_deadline for s in setups} == {True}
    assert {p.engine.prefill_by_ttft_deadline for p in AppConfig.model_validate(args).pools} == {True}
    baseline, _ = build("singlepool", window(load_trace("conv"), 0, 10), SimConfig())
    assert {s.step_time_target_s for s in baseline} == {None}  # a stock engine's fixed budget
    assert {s.prefill_by_ttft_deadline for s in baseline} == {False}  # and its arrival order


def test_a_bursty_pool_does_not_newly_fold_and_a_fold_in_force_stays(profile) -> None:
    """The profile's steady state prices a fold; a burst of short prompts landing on the
    host's fewer replicas waits behind their long prefills (on the coding trace, a fold from
    five TP2 replicas to two met 82% of TTFTs in the burst's minute). So a fold that joins a
    bursty pool is not made; one in force is not undone when a folded pool turns bursty."""
    config = WattwiseConfig(pools=POOLS)
    until_s = config.planner.tuning.first_epoch_s + config.pool_epoch_s + config.plan_interval_s + 1.0

    def run(policy: WattwisePolicy, ss_at, end_s: float, plan: ClusterPlan | None = None) -> ClusterPlan:
        t = 0.0 if plan is None else policy._next_plan_s
        while t <= end_s:
            plan = policy.observe(_serving_view({"SS": ss_at(t), "MM": 0.2, "LM": 0.2}, plan), t)
            t += config.plan_interval_s
        assert plan is not None
        return plan

    def bursts(t: float) -> float:  # 20 s of 1 req/s every 120 s, from the warm-up's end
        return 1.0 if t >= config.planner.tuning.warmup_s and t % 120.0 < 20.0 else 0.05

    bursty = WattwisePolicy(config, profile=profile)
    kept = run(bursty, bursts, until_s)
    assert bursty.planner.is_bursty("pool-short", until_s)
    assert kept.replicas["pool-short"] >= 1 and kept.routing_weights["SS"] == {"pool-short": 1.0}
    # The same arrivals read as steady (no CV crosses `bursty_cv`, a young pool's load unchecked)
    # fold the short pool.
    steady_config = config.model_copy(update={"planner": config.planner.model_copy(update={
        "tuning": config.planner.tuning.model_copy(update={"bursty_cv": 1e9, "young_fold_cv": None})})})
    steady = WattwisePolicy(steady_config, profile=profile)
    assert run(steady, bursts, until_s).replicas["pool-short"] == 0
    # Folded at steady load, the short pool stays folded through the next epoch once it bursts.
    folded = WattwisePolicy(config, profile=profile)
    plan = run(folded, lambda t: 0.5, until_s)
    assert plan.replicas["pool-short"] == 0
    later = run(folded, lambda t: 3.0 if t % 120.0 < 20.0 else 0.0, until_s + config.pool_epoch_s, plan)
    assert folded.planner.is_bursty("pool-short", until_s + config.pool_epoch_s)
    assert later.replicas["pool-short"] == 0 and later.routing_weights["SS"] != {"pool-short": 1.0}
