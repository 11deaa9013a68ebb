"""`best-static`: the cheapest fixed configuration with hindsight that meets the SLO target
(SimConfig.provision_slo_target, 99%) in every length class over the whole run.

Searched over layouts (one pool for every class, or the app's pools by input length), and per
pool over every TP and supported clock of the profile, one locked clock per pool. Pools are
independent under a static plan (the ingress routes each class to its own pool), so each pool
is searched on its own traffic:
1. rank every (TP, clock) by the CapacityModel's energy estimate: the fluid count for the
   pool's peak window, each replica drawing its steady power under its share of every
   window's load;
2. verify candidates in that order by simulation, each at the fewest replicas that meet the
   target in every class of the pool (`fewest_replicas_meeting_slos`, bisecting up from the
   fluid count for the run's mean load), until `verify_top` have met (or `max_tries` ran);
3. keep the one whose simulation drew the least energy.
On a run longer than `SimConfig.provision_search_window_s` (2 h) the simulations cover its
busiest such window (`sim.scenario.busiest_window`): a fixed fleet meeting the target at its
peak meets it where the load is lower.
A layout costs the sum of its pools; the cheapest layout whose pools all meet wins, or, if
none does, the one whose worst class comes closest. The result runs as a StaticPolicy.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from core.classes import LengthClassConfig
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load
from sim.config import SimConfig
from sim.metrics import attainment_by_class
from sim.scenario import (
    busiest_window,
    fewest_replicas_meeting_slos,
    held,
    layout,
    length_classes,
    mean_load,
    peak_load,
    pool_slo,
)
from sim.simulator import PoolSetup
from sim.workload import Workload

LAYOUTS = ("single", "by_input")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One fixed shape of a pool, as the fluid model sizes and prices it."""

    tensor_parallel: int
    clock_mhz: int
    replicas: int  # the fluid count for the pool's peak window
    estimated_energy_j: float


@dataclass(frozen=True)
class VerifiedPool:
    """A pool's shape at the fewest replicas the simulation found, and what that run showed."""

    setup: PoolSetup
    energy_j: float
    worst_class_attainment: float


@dataclass(frozen=True)
class BestStatic:
    layout: str
    pools: list[PoolSetup]
    energy_j: float  # simulated, summed over the pools
    worst_class_attainment: float
    verified: int  # candidates simulated at their fewest replicas, over every layout
    search_s: float


def median_prompts(w: Workload, lengths: LengthClassConfig) -> dict[str, float]:
    """Each length class's median prompt (tokens), for the classes `w` has."""
    classes = length_classes(w, lengths)
    return {c: float(np.median(w.prompt_tokens[classes == c])) for c in np.unique(classes)}


def ranked_candidates(w: Workload, members: tuple[str, ...], config: SimConfig,
                      lengths: LengthClassConfig) -> list[Candidate]:
    """Every (TP, clock) of the profile that carries `w`'s peak window within the pool's TBT
    target and prefills each class's median prompt within the class's TTFT target (else half
    of the class misses it), cheapest estimate first."""
    cap = CapacityModel(default_perf_model(config.model, config.hardware, config.profile))
    everything = np.ones(len(w), dtype=bool)
    window_s = config.provision_window_s
    peak, shape, slo = peak_load(w, everything, window_s), mean_load(w, everything), pool_slo(members, lengths)
    medians = median_prompts(w, lengths)
    windows, counts = np.unique(np.bincount((w.arrival_s // window_s).astype(np.int64)), return_counts=True)
    out = []
    for tp in cap.perf.tensor_parallel_degrees:
        for clock in cap.perf.gpu.supported_clocks_mhz():
            n = cap.instances_needed(tp, clock, peak, slo.tbt_s)
            slow = any(cap.prefill_s(tp, clock, prompt) > lengths.slo(c).ttft_s for c, prompt in medians.items())
            if n is None or slow:
                continue
            n = max(n, 1)
            power_w = [cap.operating(tp, clock, n, Load(arrivals / window_s, shape.mean_prompt_tokens,
                                                        shape.mean_output_tokens), slo.tbt_s).power_w
                       for arrivals in windows]
            out.append(Candidate(tp, clock, n, float(n * window_s * np.dot(power_w, counts))))
    return sorted(out, key=lambda c: c.estimated_energy_j)


def verify(w: Workload, name: str, members: tuple[str, ...], candidate: Candidate, config: SimConfig,
           lengths: LengthClassConfig) -> VerifiedPool:
    """`candidate` at the fewest replicas meeting the target in every class of `w`, bisected up
    from the fluid count for the run's mean load, and its simulated energy there."""
    cap = CapacityModel(default_perf_model(config.model, config.hardware, config.profile))
    slo = pool_slo(members, lengths)
    lowest = cap.instances_needed(candidate.tensor_parallel, candidate.clock_mhz,
                                  mean_load(w, np.ones(len(w), dtype=bool)), slo.tbt_s) or 1
    setup = PoolSetup(name, members, candidate.tensor_parallel, candidate.clock_mhz, max(lowest, 1))
    setup = replace(setup, replicas=fewest_replicas_meeting_slos(w, setup, config, lengths, every_class=True))
    raw = held(busiest_window(w, config.provision_search_window_s), setup, config, lengths)
    return VerifiedPool(setup, float(raw.series.energy_j[-1]), min(attainment_by_class(raw.log).values()))


def best_pool(w: Workload, name: str, members: tuple[str, ...], config: SimConfig, lengths: LengthClassConfig,
              verify_top: int, max_tries: int) -> tuple[VerifiedPool, int]:
    """The pool's cheapest verified shape meeting the target (else its closest), and how many
    candidates were verified."""
    tried: list[VerifiedPool] = []
    for candidate in ranked_candidates(w, members, config, lengths)[:max_tries]:
        tried.append(verify(w, name, members, candidate, config, lengths))
        if sum(v.worst_class_attainment >= config.provision_slo_target for v in tried) == verify_top:
            break
    if not tried:
        raise ValueError(f"pool {name}: no TP and clock of the profile carries its peak load within its SLOs")
    meeting = [v for v in tried if v.worst_class_attainment >= config.provision_slo_target]
    if meeting:
        return min(meeting, key=lambda v: v.energy_j), len(tried)
    return max(tried, key=lambda v: v.worst_class_attainment), len(tried)


def search_best_static(w: Workload, config: SimConfig = SimConfig(), lengths: LengthClassConfig = LengthClassConfig(),
                       verify_top: int = 3, max_tries: int = 8) -> BestStatic:
    started = time.perf_counter()
    classes = length_classes(w, lengths)
    results: list[tuple[str, list[VerifiedPool]]] = []
    verified = 0
    for name in LAYOUTS:
        pools = []
        for pool, (members, _) in layout(name).items():
            mask = np.isin(classes, members)
            if mask.any():  # a pool no request reaches is left out of the plan
                cheapest, tries = best_pool(w.take(mask), pool, members, config, lengths, verify_top, max_tries)
                pools.append(cheapest)
                verified += tries
        results.append((name, pools))

    def worst(pools: list[VerifiedPool]) -> float:
        return min(p.worst_class_attainment for p in pools)

    meeting = [r for r in results if worst(r[1]) >= config.provision_slo_target]
    chosen, pools = (min(meeting, key=lambda r: sum(p.energy_j for p in r[1])) if meeting
                     else max(results, key=lambda r: worst(r[1])))
    found = BestStatic(chosen, [p.setup for p in pools], sum(p.energy_j for p in pools), worst(pools), verified,
                       time.perf_counter() - started)
    log.info("best-static: %s layout, %s; %d candidates verified in %.0f s", found.layout,
             ", ".join(f"{s.name} {s.replicas}x TP{s.tensor_parallel} @ {s.clock_mhz:.0f} MHz" for s in found.pools),
             found.verified, found.search_s)
    return found
