"""Splitwise provisioning (sim/provision.py): the search, its SLOs and its goals."""

import numpy as np
import pytest

from sim.provision import (
    DESIGNS,
    MACHINES,
    Runs,
    SlowdownSLO,
    budget_splits,
    frontier,
    max_rate_factor,
    rank,
    search_design,
    simulate_design,
)
from sim.workload import synthetic


@pytest.fixture(scope="module")
def w():
    return synthetic(6.0, 60.0, np.random.default_rng(3), prompt_lognormal=(6.8, 0.8), output_lognormal=(4.0, 0.8))


def test_frontier_matches_brute_force_on_a_monotone_region():
    def meets(p: int, t: int) -> bool:
        return p >= 2 and t >= max(1, 6 - p)

    calls = []
    first, grid = frontier(lambda p, t: calls.append((p, t)) or meets(p, t), 6, 6)
    assert first == {p: max(1, 6 - p) for p in range(2, 7)}
    assert all(g.feasible == meets(g.prompt, g.token) for g in grid)
    assert len(set(calls)) < 36 // 2  # far fewer runs than the grid


def test_max_rate_factor_brackets_the_threshold():
    f = max_rate_factor(lambda x: x <= 3.3, rel_tol=0.02)
    assert 3.3 / 1.02 <= f <= 3.3
    assert max_rate_factor(lambda x: False) is None


def test_budget_splits_fill_the_power_budget():
    hhcap = DESIGNS["HHcap"]
    limit = 8 * MACHINES["H"].provisioned_kw
    splits = budget_splits(hhcap, hhcap.power_kw, limit, 8)
    for p, t in splits:
        assert hhcap.power_kw(p, t) <= limit < hhcap.power_kw(p, t + 1)
    assert budget_splits(DESIGNS["base-H"], DESIGNS["base-H"].power_kw, limit, 12) == [(8, 0)]


def test_unfinished_requests_fail_every_slowdown_limit(w):
    o = simulate_design(w, DESIGNS["base-H"], 1, 0)
    busy = simulate_design(w, DESIGNS["base-H"], 4, 0)
    assert busy.slowdowns["ttft"][99] < o.slowdowns["ttft"][99]
    assert not o.meets_slo and o.violations


def test_cost_optimum_meets_the_slos_and_nothing_cheaper_does(w):
    runs = Runs(w)
    hh = DESIGNS["HH"]
    best = rank(search_design(runs, hh, "cost", 4, 4).candidates, "cost")[0]
    again = simulate_design(w, hh, best.prompt, best.token)  # fresh run, not the cache
    assert again.meets_slo and again.violations == ()
    for p in range(1, 5):
        for t in range(1, 5):
            if hh.cost_per_hour(p, t) < best.cost_per_hour:
                assert not runs(hh, p, t).meets_slo


def test_a_stricter_slo_never_yields_a_cheaper_plan(w):
    hh = DESIGNS["HH"]
    costs = []
    for factor in (1.0, 0.8, 0.6):
        found = search_design(Runs(w, SlowdownSLO().scaled(factor)), hh, "cost", 5, 5).candidates
        costs.append(min((o.cost_per_hour for o in found), default=float("inf")))
    assert costs == sorted(costs) and costs[0] < float("inf")


def test_the_power_goal_picks_capped_token_machines_the_cost_goal_does_not_pay_for(w):
    runs = Runs(w)
    searches = {n: search_design(runs, DESIGNS[n], "cost", 4, 4) for n in ("HH", "HHcap")}
    both = [o for s in searches.values() for o in s.candidates]
    by_cost, by_power = rank(both, "cost")[0], rank(both, "power")[0]
    assert by_power.design == "HHcap"  # same machines, capped tokens: less provisioned power
    assert by_power.power_kw < min(o.power_kw for o in searches["HH"].candidates)
    assert by_cost.cost_per_hour <= by_power.cost_per_hour


def test_slowdowns_are_one_for_a_lone_request_on_the_reference_machine():
    one = synthetic(0.01, 100.0, np.random.default_rng(0))
    one = type(one)(one.arrival_s[:1], one.prompt_tokens[:1], one.output_tokens[:1] + 5, one.interactive[:1])
    o = simulate_design(one, DESIGNS["base-A"], 1, 0)
    for metric in ("ttft", "tbt", "e2e"):
        assert o.slowdowns[metric][50] == pytest.approx(1.0, rel=0.05), metric
