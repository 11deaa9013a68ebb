"""The SLO guard: what replicas count, when the guard names a class, what the wattwise policy
does for a guarded class, and that it lifts a class the wattwise policy's savings let miss."""

import pytest

from autoscaling.dynamollm.pool_folding import PoolFolding, PoolGroup
from autoscaling.slo_guard import SloGuard, SloGuardConfig, SloGuardTuning
from autoscaling.wattwise import WattwiseConfig, WattwisePolicy
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.plan import ClusterPlan
from core.request import Request
from core.slo import SLO
from core.slo_outcomes import ClassOutcomes, SloOutcomes, mean_tbt_s, slo_met
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from deployments.serve_adapter import view_from_contexts
from energy.calibration import default_perf_model
from energy.profile_builder import build_profile
from sim.config import SimConfig
from sim.metrics import slo_met as log_slo_met
from sim.metrics import worst_class
from sim.records import CLASS_INDEX, RequestLog
from sim.run import simulate
from sim.scenario import build
from sim.workload import fit_context, load_trace, window
from tests.factories import autoscaling_context, by_deployment

POOLS = {"pool-short": ["SS", "SM", "SL"], "pool-medium": ["MS", "MM", "ML"], "pool-long": ["LS", "LM", "LL"]}
OWN_POOL = {cls: pool for pool, classes in POOLS.items() for cls in classes}


@pytest.fixture(scope="module")
def profile():
    return build_profile(default_perf_model("llama2-70b", "h100-80gb"))


def test_the_window_counts_finished_requests_per_class_and_forgets_old_ones() -> None:
    outcomes = SloOutcomes(window_s=60.0)
    outcomes.add(0.0, "SS", True)
    outcomes.add(10.0, "SS", False)
    outcomes.add(30.0, "LM", True)
    assert outcomes.counts(30.0) == ClassOutcomes(completed={"SS": 2, "LM": 1}, met={"SS": 1, "LM": 1})
    assert outcomes.counts(65.0) == ClassOutcomes(completed={"SS": 1, "LM": 1}, met={"LM": 1})
    assert outcomes.counts(200.0) == ClassOutcomes(completed={}, met={})


def test_a_request_meets_its_slo_at_its_targets_not_beyond() -> None:
    slo = SLO(ttft_s=0.25, tbt_s=0.1)
    assert slo_met(slo, 0.25, 0.1)
    assert not slo_met(slo, 0.26, 0.05) and not slo_met(slo, 0.1, 0.11)
    assert mean_tbt_s(1.0, 1.0, 1) == 0.0 and mean_tbt_s(1.0, 2.0, 11) == pytest.approx(0.1)


def test_a_replica_counts_its_interactive_outcomes_as_the_simulators_report_judges_them() -> None:
    """Requests whose TTFT, TBT or neither miss, and batch work (not counted), run on one
    batcher; its window's counts are what sim.metrics.slo_met finds in the same requests."""
    batcher = ContinuousBatcher(default_perf_model("llama2-70b", "h100-80gb"), BatcherConfig(tensor_parallel=8))
    slos = [SLO(ttft_s=10.0, tbt_s=1.0), SLO(ttft_s=1e-4, tbt_s=1.0), SLO(ttft_s=10.0, tbt_s=1e-4)]
    requests = [Request(request_id=str(i), prompt_tokens=200 + 300 * i, max_tokens=20, target_output_tokens=20,
                        arrival_s=0.0, slo=slos[i % 3], length_class=("SS", "LM")[i % 2],
                        service_class="batch" if i % 5 == 4 else "interactive") for i in range(12)]
    log = RequestLog(len(requests))
    for i, request in enumerate(requests):
        batcher.add(request, 0.0)
        log.slo_ttft_s[i], log.slo_tbt_s[i] = request.slo.ttft_s, request.slo.tbt_s
        log.length_class[i], log.interactive[i] = CLASS_INDEX[request.length_class], request.service_class != "batch"
    # Before any token: the interactive requests past their TTFT deadline are misses already.
    due = [r for r in requests if r.service_class != "batch" and r.slo.ttft_s < 0.5]
    assert batcher.stats(0.5).slo_late == {cls: sum(r.length_class == cls for r in due) for cls in ("SS", "LM")}
    now_s = 0.0
    while (step := batcher.plan_step(now_s)) is not None:
        now_s = step.end_s
        for seq in batcher.finish_step(step).finished:
            log.finish(int(seq.request_id), seq)
    assert log.done.all()
    met = log_slo_met(log)
    stats = batcher.stats(now_s)
    for cls in ("SS", "LM"):
        mine = log.interactive & (log.length_class == CLASS_INDEX[cls])
        assert stats.slo_completed[cls] == mine.sum()
        assert stats.slo_met.get(cls, 0) == (met & mine).sum()
    assert 0 < sum(stats.slo_met.values()) < sum(stats.slo_completed.values())  # both kinds are in it
    assert stats.slo_late == {}  # each counted once: late until its first token, then when it finishes
    assert batcher.stats(now_s + BatcherConfig().slo_window_s + 1.0).slo_completed == {}


def test_the_counts_survive_serves_flat_metrics_and_are_no_extra_metric() -> None:
    stats = ReplicaStats(queued_requests=3, class_rates_per_s={"SS": 1.5},
                         slo_completed={"SS": 40, "LM": 3}, slo_met={"SS": 39}, slo_late={"LM": 2})
    flat = stats.to_metrics()
    assert ReplicaStats.from_metrics(flat) == stats
    view = view_from_contexts(by_deployment(autoscaling_context("pool-a", 2, flat)))
    dep = view.deployments["pool-a"]
    assert [s.slo_completed for s in dep.replica_stats] == [{"SS": 40, "LM": 3}] * 2
    assert dep.extra_metrics == {}


def _view(completed: dict[str, int], met: dict[str, int], late: dict[str, int] | None = None) -> ClusterView:
    """One replica per pool, each reporting the outcomes of its own classes."""
    def own(counts: dict[str, int], pool: str) -> dict[str, int]:
        return {c: n for c, n in counts.items() if OWN_POOL[c] == pool}

    return ClusterView({pool: DeploymentView(pool, 1, 1, 0, 64, (ReplicaStats(
        tensor_parallel=2, slo_completed=own(completed, pool), slo_met=own(met, pool),
        slo_late=own(late or {}, pool)),)) for pool in POOLS})


def test_the_guard_names_a_class_below_target_with_enough_samples_and_frees_it_after_recovery_held() -> None:
    config = SloGuardConfig(target_attainment=0.99, tuning=SloGuardTuning(min_completed=20, min_misses=2,
                                                                           recover_hold_s=100.0, warmup_s=0.0))
    guard = SloGuard(config)
    assert guard.update(_view({"LM": 19}, {"LM": 10}), 0.0) == {}  # too few to judge
    assert guard.update(_view({"LM": 100, "SS": 50}, {"LM": 99, "SS": 50}), 5.0) == {}  # at target
    assert guard.update(_view({"LM": 50}, {"LM": 49}), 6.0) == {}  # 98%, but one miss is no evidence
    assert guard.update(_view({"LM": 100, "SS": 50}, {"LM": 98, "SS": 50}), 10.0) == {"LM": 10.0}
    # Held through a dip back under target; the recovery clock starts once it holds the target.
    assert guard.update(_view({"LM": 100}, {"LM": 100}), 20.0) == {"LM": 10.0}
    assert guard.update(_view({"LM": 100}, {"LM": 97}), 60.0) == {"LM": 10.0}
    assert guard.update(_view({"LM": 100}, {"LM": 100}), 70.0) == {"LM": 10.0}
    assert guard.update(_view({"LM": 5}, {"LM": 5}), 169.0) == {"LM": 10.0}  # too few finished: not a miss
    assert guard.update(_view({"LM": 100}, {"LM": 100}), 170.0) == {}
    # A class whose replicas all went away (nothing reported) recovers the same way.
    assert guard.update(_view({"SM": 30}, {"SM": 20}), 200.0) == {"SM": 200.0}
    assert guard.update(_view({}, {}), 250.0) == {"SM": 200.0}
    assert guard.update(_view({}, {}), 350.0) == {}
    # Requests waiting past their TTFT deadline are misses before they finish.
    assert SloGuard(config).update(_view({"MM": 30}, {"MM": 30}, late={"MM": 2}), 0.0) == {"MM": 0.0}
    # While the pools grow from the operator's start shape, misses are not the savings' doing.
    warming = SloGuard(config.model_copy(update={"tuning": config.tuning.model_copy(update={"warmup_s": 60.0})}))
    assert warming.update(_view({"LM": 100}, {"LM": 50}), 1000.0) == {}
    assert warming.update(_view({"LM": 100}, {"LM": 50}), 1059.0) == {}
    assert warming.update(_view({"LM": 100}, {"LM": 50}), 1060.0) == {"LM": 1060.0}


def test_a_class_that_misses_again_while_guarded_doubles_its_margin_up_to_the_escalations() -> None:
    config = SloGuardConfig(tuning=SloGuardTuning(min_completed=20, min_misses=2, recover_hold_s=100.0,
                                                  warmup_s=0.0, load_margin=0.25, escalations=2))
    guard = SloGuard(config)
    miss, meet = _view({"LS": 100}, {"LS": 90}), _view({"LS": 100}, {"LS": 100})
    assert guard.load_margin(["LS", "LM"]) == 0.25  # nothing guarded: the base margin
    guard.update(miss, 0.0)
    guard.update(miss, 10.0)  # the same episode's misses: no escalation
    assert guard.load_margin(["LS", "LM"]) == 0.25
    guard.update(meet, 20.0)
    guard.update(miss, 30.0)  # met its target while guarded, then missed: the margin fell short
    assert guard.load_margin(["LS", "LM"]) == 0.5
    assert guard.load_margin(["SS"]) == 0.25  # another pool's classes keep the base margin
    for t in (40.0, 60.0, 70.0, 90.0):  # two more episodes: capped at two doublings
        guard.update(meet if t in (40.0, 70.0) else miss, t)
    assert guard.load_margin(["LS"]) == 1.0
    # Released after holding its target; guarded again, it starts from the margin it had reached.
    guard.update(meet, 100.0)
    assert guard.update(meet, 200.0) == {}
    guard.update(miss, 300.0)
    assert guard.load_margin(["LS"]) == 1.0


def test_unfolding_a_pool_cuts_it_out_of_its_group_and_keeps_the_rest_together() -> None:
    folding = PoolFolding(list(POOLS), 33.0, 300.0)
    folding.groups = (PoolGroup(("pool-short", "pool-medium", "pool-long")),)
    folding.unfold({"pool-long"})
    assert folding.groups == (PoolGroup(("pool-short", "pool-medium")), PoolGroup(("pool-long",)))
    folding.groups = (PoolGroup(("pool-short", "pool-medium", "pool-long")),)
    folding.unfold({"pool-medium"})
    assert folding.groups == tuple(PoolGroup((p,)) for p in POOLS)


def _serving_view(rates: dict[str, float], plan: ClusterPlan | None, outcomes: dict[str, tuple[int, int]],
                  ) -> ClusterView:
    """A cluster that runs `plan` at once, each class's arrivals and outcomes reported by the
    pool the plan routes it to ({class: (completed, met)})."""
    deps = {}
    for name in POOLS:
        replicas = plan.replicas.get(name, 1) if plan is not None else 1
        routed = plan.routing_weights if plan is not None else {}
        served = [c for c in OWN_POOL if routed.get(c, {OWN_POOL[c]: 1.0}) == {name: 1.0}]
        tp = plan.tensor_parallel.get(name, 2) if plan is not None else 2
        stats = ReplicaStats(tensor_parallel=tp, per_step_clock=True,
                             class_rates_per_s={c: rates[c] / max(replicas, 1) for c in served if c in rates},
                             slo_completed={c: outcomes[c][0] for c in served if c in outcomes},
                             slo_met={c: outcomes[c][1] for c in served if c in outcomes})
        deps[name] = DeploymentView(name, replicas, replicas, 0, 64, (stats,) * replicas)
    return ClusterView(deps)


def _run(policy: WattwisePolicy, rates: dict[str, float], start_s: float, until_s: float,
         plan: ClusterPlan | None = None, outcomes: dict[str, tuple[int, int]] | None = None) -> ClusterPlan:
    t = start_s
    while t <= until_s:
        plan = policy.observe(_serving_view(rates, plan, outcomes or {}), t)
        t += policy.config.plan_interval_s
    assert plan is not None
    return plan


def test_a_guarded_class_runs_its_pool_flat_out_and_unfolded_and_the_plan_says_so(profile) -> None:
    """Low steady load folds the short pool into another and lets the long pool's replicas
    pick clocks down to its least-power carrying clock. Then short prompts miss: their pool serves alone again at the
    top clock. Long prompts missing too put the long pool at the top clock, alone, where a twin
    whose long prompts meet their SLOs keeps saving; the plan lists the guarded classes, and
    a class that meets its target keeps its savings."""
    rates = {"SS": 0.3, "MM": 0.3, "LM": 2.2}
    config = WattwiseConfig(pools=POOLS)
    top = max(profile.clocks_mhz)
    settled_s = config.planner.tuning.first_epoch_s + 2 * config.pool_epoch_s
    guarded, twin = WattwisePolicy(config, profile=profile), WattwisePolicy(config, profile=profile)
    before = _run(guarded, rates, 0.0, settled_s)
    assert before == _run(twin, rates, 0.0, settled_s)
    assert before.replicas["pool-short"] == 0 and before.routing_weights["SS"] != {"pool-short": 1.0}
    saving = before.clock_band_mhz["pool-long"][0]  # the least-power clock that carries its load
    assert saving < top and not before.slo_guard
    short_miss = {"SS": (40, 30), "MM": (40, 40)}
    after_s = settled_s + 3 * config.plan_interval_s
    plan = _run(guarded, rates, guarded._next_plan_s, after_s, before, {**short_miss, "LM": (100, 90)})
    other = _run(twin, rates, twin._next_plan_s, after_s, before, short_miss)
    assert set(plan.slo_guard) == {"SS", "LM"} and set(other.slo_guard) == {"SS"}
    assert "slo guard: LM under target" in plan.reason
    for p in (plan, other):  # unfolded: SS back on its own pool once that serves, flat out
        assert p.replicas["pool-short"] >= 1 and p.routing_weights["SS"] == {"pool-short": 1.0}
        assert p.clock_band_mhz["pool-short"] == (top, top)
    # The long pool guarded serves alone: the medium pool it had taken in serves MM again, saving.
    assert plan.clock_band_mhz["pool-long"] == (top, top) and plan.routing_weights["MM"] == {"pool-medium": 1.0}
    assert plan.clock_band_mhz["pool-medium"][0] < top
    assert other.clock_band_mhz["pool-long"][0] == saving
    # With the guard off the wattwise policy never writes the entry.
    off = WattwisePolicy(config.model_copy(update={"slo_guard": SloGuardConfig(enabled=False)}), profile=profile)
    assert not _run(off, rates, 0.0, config.slo_guard.tuning.warmup_s + config.plan_interval_s,
                    outcomes={"LM": (100, 50)}).slo_guard


def test_a_guarded_pool_is_planned_for_its_load_margin_more(profile) -> None:
    """One TP2 replica carries the forecast (2.2 LM/s plus the burst margin); the forecast and
    the guard's quarter more take two."""
    config = WattwiseConfig(pools={"pool-long": POOLS["pool-long"]}, fold_pools=False,
                            tensor_parallel_options={"pool-long": [2]},
                            slo_guard=SloGuardConfig(tuning=SloGuardTuning(warmup_s=0.0)))

    def planned(met: int) -> int:
        stats = ReplicaStats(tensor_parallel=2, class_rates_per_s={"LM": 2.2}, slo_completed={"LM": 100},
                             slo_met={"LM": met})
        view = ClusterView({"pool-long": DeploymentView("pool-long", 1, 1, 0, 64, (stats,))})
        return WattwisePolicy(config, profile=profile).observe(view, 0.0).replicas["pool-long"]

    assert planned(met=100) == 1 and planned(met=90) == 2


def test_a_guarded_pool_keeps_the_tp_it_runs(profile) -> None:
    """Past the first pool epoch the planner moves TP2 replicas to the TP it prices cheaper; a
    guarded pool grows at the TP it runs instead of restarting replicas whose SLOs miss."""
    config = WattwiseConfig(pools={"pool-long": POOLS["pool-long"]}, fold_pools=False,
                            slo_guard=SloGuardConfig(tuning=SloGuardTuning(warmup_s=0.0)))

    def tp_after(met: int) -> int:
        policy, t, plan = WattwisePolicy(config, profile=profile), 0.0, ClusterPlan()
        while t <= config.planner.tuning.first_epoch_s + config.pool_epoch_s:
            replicas = plan.replicas.get("pool-long", 1)
            stats = ReplicaStats(tensor_parallel=plan.tensor_parallel.get("pool-long", 2),
                                 class_rates_per_s={"LL": 6.0 / replicas}, slo_completed={"LL": 100 // replicas},
                                 slo_met={"LL": met // replicas})
            view = ClusterView({"pool-long": DeploymentView("pool-long", replicas, replicas, 0, 64,
                                                            (stats,) * replicas)})
            plan = policy.observe(view, t)
            t += config.plan_interval_s
        return plan.tensor_parallel["pool-long"]

    assert tp_after(met=100) != 2 and tp_after(met=90) == 2


def test_a_run_may_turn_the_wattwise_guard_off_and_no_other_policys() -> None:
    w = fit_context(window(load_trace("mooncake"), 0.0, 10.0), 8192)
    _, policy = build("wattwise", w, SimConfig(), wattwise_settings={"slo_guard": {"enabled": False}})
    assert isinstance(policy, WattwisePolicy) and not policy.config.slo_guard.enabled
    with pytest.raises(ValueError, match="wattwise settings are for the wattwise policy"):
        build("singlepool", w, SimConfig(), wattwise_settings={"slo_guard": {"enabled": False}})


def test_on_long_prompts_the_guard_lifts_the_classes_the_savings_let_miss() -> None:
    """Minutes 5-12 of the Mooncake trace (prompts clipped at the context), planned on the
    profile's prompts, which run 2-2.4x shorter than the trace's: without the guard the wattwise
    policy misses in every long class; with it, each long class meets more of its SLOs, and the
    guard was on for one of them. Planned on the prompts the replicas see, it needs no guard."""
    w = fit_context(window(load_trace("mooncake"), 300.0, 400.0), 8192)
    profiled = {"planner": {"follow_prompt_lengths": False}}
    unguarded, _ = simulate("wattwise", w, SimConfig(), wattwise_settings={**profiled, "slo_guard": {"enabled": False}})
    guarded, _ = simulate("wattwise", w, SimConfig(), wattwise_settings=profiled)
    followed, _ = simulate("wattwise", w, SimConfig(), wattwise_settings={"slo_guard": {"enabled": False}})
    assert worst_class(followed)[1] >= 0.99
    assert not unguarded["slo_guard_s"] and guarded["slo_guard_s"].keys() & {"LS", "LM", "LL"}
    assert worst_class(unguarded)[1] < 0.99
    for cls in ("LS", "LM", "LL"):
        assert guarded["slo_attainment"][cls] > unguarded["slo_attainment"][cls]
    assert worst_class(guarded)[1] > worst_class(unguarded)[1]
