"""best-static's search: candidates ranked by the fluid model's energy, verified by simulation at
the fewest replicas meeting the target in every class, the cheapest verified kept."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import sim.best_static as best_static
from core.classes import LengthClassConfig
from sim.best_static import Candidate, VerifiedPool, best_pool, ranked_candidates, search_best_static, verify
from sim.config import SimConfig
from sim.run import simulate
from sim.scenario import busiest_window, layout, meets_slos
from sim.simulator import PoolSetup
from sim.workload import Workload, fit_context, load_trace, superpose, synthetic, window

EVERYTHING = tuple(LengthClassConfig.names())
CONFIG = SimConfig()


@pytest.fixture(scope="module")
def code_bursts() -> Workload:
    """The coding trace's first 5 minutes: bursts of long prompts a peak-minute count undersizes."""
    return fit_context(window(load_trace("code"), 0, 300), 8192)


def _verified(candidate: Candidate, energy_j: float, worst: float) -> VerifiedPool:
    setup = PoolSetup("pool-all", EVERYTHING, candidate.tensor_parallel, candidate.clock_mhz, candidate.replicas)
    return VerifiedPool(setup, energy_j, worst)


def test_the_cheapest_candidate_that_meets_every_class_wins_over_a_cheaper_estimate_that_misses_one(
        monkeypatch, code_bursts):
    misses, dear, cheap = Candidate(2, 800, 1, 1.0), Candidate(8, 1980, 2, 2.0), Candidate(4, 1400, 2, 3.0)
    outcomes = {misses: (1.0, 0.95), dear: (9.0, 1.0), cheap: (5.0, 0.995)}
    monkeypatch.setattr(best_static, "ranked_candidates", lambda *a: [misses, dear, cheap])
    monkeypatch.setattr(best_static, "verify", lambda w, name, members, c, *a: _verified(c, *outcomes[c]))
    found, tried = best_pool(code_bursts, "pool-all", EVERYTHING, CONFIG, LengthClassConfig(), verify_top=2,
                             max_tries=8)
    assert (found.setup.tensor_parallel, found.setup.clock_mhz) == (4, 1400)
    assert tried == 3


def test_the_cheapest_layout_whose_pools_all_meet_is_kept(monkeypatch, code_bursts):
    def pool(w, name, members, *a):
        setup = PoolSetup(name, members, 8, 1980, 1)
        # One pool for all is cheaper but misses a class; the pools by input length all meet.
        return (VerifiedPool(setup, 1.0, 0.9), 1) if name == "pool-all" else (VerifiedPool(setup, 2.0, 1.0), 1)

    monkeypatch.setattr(best_static, "best_pool", pool)
    found = search_best_static(code_bursts)
    assert found.layout == "by_input"
    assert found.worst_class_attainment == 1.0


def test_candidates_carry_the_peak_within_the_slos_and_come_cheapest_estimate_first(code_bursts):
    candidates = ranked_candidates(code_bursts, EVERYTHING, CONFIG, LengthClassConfig())
    energies = [c.estimated_energy_j for c in candidates]
    assert energies == sorted(energies) and len({(c.tensor_parallel, c.clock_mhz) for c in candidates}) > 10
    lengths = LengthClassConfig()
    cap = best_static.CapacityModel(best_static.default_perf_model(CONFIG.model, CONFIG.hardware, CONFIG.profile))
    medians = best_static.median_prompts(code_bursts, lengths)
    assert all(cap.prefill_s(c.tensor_parallel, c.clock_mhz, prompt) <= lengths.slo(cls).ttft_s
               for c in candidates for cls, prompt in medians.items())
    # A TTFT no shape prefills the long class's median prompt in leaves no candidate.
    assert ranked_candidates(code_bursts, EVERYTHING, CONFIG, LengthClassConfig(ttft_s={"S": 0.25, "M": 0.4,
                                                                                        "L": 0.001})) == []


def test_a_verified_candidate_has_the_fewest_replicas_meeting_every_class(code_bursts):
    found = verify(code_bursts, "pool-all", EVERYTHING, Candidate(8, 1980, 1, 0.0), CONFIG, LengthClassConfig())
    assert found.worst_class_attainment >= CONFIG.provision_slo_target
    assert meets_slos(code_bursts, found.setup, CONFIG, every_class=True)
    assert found.setup.replicas > 1  # the bursts need more than the mean load's count
    assert not meets_slos(code_bursts, replace(found.setup, replicas=found.setup.replicas - 1), CONFIG,
                          every_class=True)


def test_best_static_runs_as_a_static_plan_and_meets_every_class():
    w = fit_context(window(load_trace("conv"), 0, 120), 8192)
    summary, raw = simulate("best-static", w)
    assert summary["completed"] == len(w)
    classes = {k: v for k, v in summary["slo_attainment"].items() if len(k) == 2}
    assert min(classes.values()) >= CONFIG.provision_slo_target
    assert set(raw.pool_names) <= set(layout("single")) | set(layout("by_input"))
    for name in raw.pool_names:  # nothing moves a static plan
        assert len(set(raw.series.ready[name][1:])) <= 1 and len(set(np.round(raw.series.clock_mhz[name]))) <= 1


def test_a_long_run_is_searched_on_its_busiest_window() -> None:
    """A day's static fleet is sized on its peak hours: the window holding the most requests."""
    rng = np.random.default_rng(0)
    calm, busy = synthetic(0.2, 7200.0, rng), synthetic(2.0, 1800.0, rng)
    w = superpose(calm, Workload(busy.arrival_s + 3600.0, busy.prompt_tokens, busy.output_tokens, busy.interactive))
    peak = busiest_window(w, 1800.0)
    assert peak.arrival_s[-1] <= 1800.0 and len(peak) >= len(busy)
    assert busiest_window(peak, 1800.0) is peak  # short enough already
