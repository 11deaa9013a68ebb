"""throttLL'eM alone on the one controller's workloads: the engine sizes its autoscaler picks
among and the headrooms its clock plans with, against its headline (>= 1.7x tokens/J over the
static max clock at >= 99% of E2E deadlines).

    wattwise bench throttllem-engines [--jobs 2]

Why: with the paper's settings (every TP; ThrottllemConfig's headrooms, as the composite's
replicas keep) throttLL'eM alone met 88% of its deadlines on code. Its autoscaler sizes each engine
for the requests/s it measured (§IV-D: 10 s monitor, shadow instancing, a spawn-long grace):
code's mean rate needs only TP2 engines, and its bursts (up to 268 requests in 5 s) end before
a larger engine is ready. Each variant keeps the engine count `bench wattwise` gives it (the
fewest TP8 engines meeting the SLOs at the max clock) and changes the sizes or the headrooms.

The tuning windows are the first half hours of conv and code; the held-out ones their second
halves (`bench wattwise`'s conv-heldout and code-heldout) and the batch mix's (conv with 30%
batch requests), which also reports the TTFT/TBT SLO that the deadlines alone do not show.
The choice is the variant with the most tokens/J (the smaller of the two tuning windows')
among those meeting the headline on both; `bench wattwise` runs it (sim.scenario.THROTTLLEM_ALONE),
and the bench exits 1 if the two part.
"""

from __future__ import annotations

import argparse
import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.wattwise import HEADLINES, workload
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import THROTTLLEM_ALONE, ThrottllemAlone, build, provisioned, throttllem_alone
from sim.simulator import Simulator
from sim.workload import Workload, window

REFERENCE = "static-max-clock"
HALF_S = 1800.0
TUNING = (("conv", 0.0), ("code", 0.0))
HELD_OUT = (("conv", HALF_S), ("code", HALF_S), ("batch-mix", HALF_S))
PAPER = ThrottllemAlone()
VARIANTS = tuple(ThrottllemAlone(tps, ttft, slo) for tps, (ttft, slo) in itertools.product(
    (None, (4, 8), (8,)), ((None, None), (0.3, 0.5), (0.2, 0.4), (0.15, 0.3))))


@dataclass(frozen=True)
class Outcome:
    """One variant on one window, against the static max clock on the same window."""

    tokens_per_j_x_static: float
    deadlines: float  # share of requests done by their E2E deadline
    slo: float  # share meeting their TTFT and mean TBT targets

    def meets(self) -> bool:
        return (self.tokens_per_j_x_static >= HEADLINES["throttllem_tokens_per_j_x_static"]
                and self.deadlines >= HEADLINES["throttllem_deadlines"])


def run(w: Workload, alone: ThrottllemAlone | None, config: SimConfig = SimConfig()) -> dict[str, Any]:
    """One simulated run: throttLL'eM alone with `alone`'s settings, or the static max clock (None)."""
    if alone is None:
        setups, policy = build(REFERENCE, w, config)
    else:
        setups, policy = throttllem_alone(provisioned("throttllem", w, config), config, alone)
    return summarise(Simulator(w, policy, setups, config).run(), config)


def _run_window(job: tuple[tuple[str, float], ThrottllemAlone | None]) -> dict[str, Any]:
    (name, start_s), alone = job
    return run(window(workload(name, 24.0, 0), start_s, HALF_S), alone)


def outcome(result: dict[str, Any], reference: dict[str, Any]) -> Outcome:
    return Outcome(reference["j_per_token"] / result["j_per_token"], result["e2e_deadline_attainment"],
                   result["slo_attainment"]["overall"])


def choose(tuning: dict[ThrottllemAlone, list[Outcome]]) -> ThrottllemAlone | None:
    """The variant meeting the headline on every tuning window with the most tokens/J on its
    worst one; None if no variant meets it."""
    meeting = [v for v, outcomes in tuning.items() if all(o.meets() for o in outcomes)]
    return max(meeting, key=lambda v: min(o.tokens_per_j_x_static for o in tuning[v]), default=None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench throttllem-engines", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2, help="simulations run in parallel")
    args = p.parse_args(argv)
    windows = (*TUNING, *HELD_OUT)
    jobs = [(w, v) for w in windows for v in (None, *VARIANTS)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip(jobs, pool.map(_run_window, jobs), strict=True))
    outcomes = {v: [outcome(results[(w, v)], results[(w, None)]) for w in windows] for v in VARIANTS}
    names = [f"{n} {'tuning' if (n, s) in TUNING else 'held out'}" for n, s in windows]
    print("per window: tokens/J x static max clock, E2E deadlines met, TTFT/TBT SLO met; headline: "
          f">= {HEADLINES['throttllem_tokens_per_j_x_static']:g}x at >= {HEADLINES['throttllem_deadlines']:.0%}")
    print(f"{'variant':>46} " + " ".join(f"{n:>24}" for n in names))
    for v in VARIANTS:
        cells = [f"{o.tokens_per_j_x_static:.2f}x {o.deadlines:7.2%} {o.slo:6.1%}{'  ' if o.meets() else ' *'}"
                 for o in outcomes[v]]
        label = v.label + (" (the paper's)" if v == PAPER else " (bench wattwise's)" if v == THROTTLLEM_ALONE else "")
        print(f"{label:>46} " + " ".join(f"{c:>24}" for c in cells))
    print("  * misses the headline")
    chosen = choose({v: outcomes[v][:len(TUNING)] for v in VARIANTS})
    print(f"chosen on the tuning windows: {chosen.label if chosen else 'none meets the headline'}; "
          f"`bench wattwise` runs {THROTTLLEM_ALONE.label} (sim.scenario.THROTTLLEM_ALONE)")
    return 0 if chosen == THROTTLLEM_ALONE else 1
