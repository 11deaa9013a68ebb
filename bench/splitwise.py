"""Iso-power Splitwise (§VI-B): Splitwise-HH, -HHcap, -AA, -HA vs mixed-batching pools of
the same machines, each given the same provisioned power, on the Azure code and
conversation traces in the simulator.

    wattwise bench splitwise [--duration-s 120] [--budget-h100 8] [--traces code,conv] [--jobs 2]

The budget is the provisioned power of `--budget-h100` DGX-H100s (Table V: 1.75x a
DGX-A100's 6.5 kW); each design gets the most machines that fit under it (baseline-H100:
8 H, baseline-A100: 14 A), and for split designs every prompt/token split that fills it is
tried. Throughput at SLO is the highest Poisson request rate (sizes drawn from the trace, as
the paper's §V-B does) at which all nine Table VI slowdown SLOs hold, found by bisection on
the rate to 5%. All rows of a trace come from the
same workloads; ratios are vs baseline-H100 and vs the mixed pool of the design's own
prompt machines. Machines are whole DGXs, so a small budget leaves split designs a coarse
choice of splits (conv's HHcap: 1.06x at 8, 1.19x at 16, 1.36x at 40; docs/splitwise.md):
8 is a quick comparison of every design; the paper's 40 (§VI-B, PAPER_BUDGET_H100) is what
Splitwise's headline in `wattwise bench wattwise --splitwise-headline` runs.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np

from sim.provision import DESIGNS, MACHINES, Outcome, Runs, search_throughput
from sim.workload import fit_context, load_trace, synthetic

ORDER = ("base-H", "base-A", "HH", "HHcap", "AA", "HA")
# §VI-B: "we use the power for 40 DGX-H100 machines as our target peak power".
PAPER_BUDGET_H100 = 40.0


def trace_runs(trace: str, duration_s: float, seed: int) -> Runs:
    """Poisson arrivals at `factor` x the trace's mean rate for `duration_s`, sizes from the trace."""
    full = fit_context(load_trace(trace), 8192)
    base_rps = len(full) / full.duration_s

    def at(factor: float):
        return synthetic(base_rps * factor, duration_s, np.random.default_rng(seed), lengths_from=full)

    return Runs(at(1.0), make_workload=at)


def iso_power_best(runs: Runs, design: str, limit_kw: float) -> Outcome | None:
    """The design's highest rate meeting Table VI's SLOs within `limit_kw` provisioned."""
    return next((o for o in search_throughput(runs, DESIGNS[design], "power", limit_kw, 64) if o.meets_slo), None)


def iso_power_budget_kw(budget_h100: float) -> float:
    """The power of `budget_h100` DGX-H100 machines as provisioned: what every design gets."""
    return budget_h100 * MACHINES["H"].provisioned_kw


@dataclass(frozen=True)
class Search:
    """One design's iso-power search on one trace: its best point, and what it took."""

    trace: str
    design: str
    best: Outcome | None  # None: the SLOs hold at no rate tried
    runs: int  # simulations
    seconds: float


def search(trace: str, design: str, duration_s: float, seed: int, budget_h100: float) -> Search:
    """Designs share no simulation (each run is one design's), so each searches alone."""
    runs, started = trace_runs(trace, duration_s, seed), time.perf_counter()
    best = iso_power_best(runs, design, iso_power_budget_kw(budget_h100))
    return Search(trace, design, best, len(runs.cache), time.perf_counter() - started)


def searches(traces: list[str], designs: list[str], duration_s: float, seed: int, budget_h100: float,
             jobs: int) -> dict[tuple[str, str], Search]:
    """Every (trace, design) search, `jobs` at a time."""
    keys = [(t, d) for t in traces for d in designs]
    one = partial(search, duration_s=duration_s, seed=seed, budget_h100=budget_h100)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return {(s.trace, s.design): s for s in pool.map(one, *zip(*keys, strict=True))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench splitwise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=120.0, help="span of Poisson arrivals per simulated point")
    p.add_argument("--budget-h100", type=float, default=8.0, help=(
        f"power budget in DGX-H100s (the paper's: {PAPER_BUDGET_H100:g}; its split designs need the finer choice)"))
    p.add_argument("--traces", default="code,conv")
    p.add_argument("--designs", default=",".join(ORDER))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="searches run in parallel")
    args = p.parse_args(argv)
    designs, traces = args.designs.split(","), args.traces.split(",")
    print(f"iso-power budget: {iso_power_budget_kw(args.budget_h100):.1f} kW provisioned ({args.budget_h100:g} "
          f"DGX-H100); Table VI SLOs; {args.duration_s:.0f} s of Poisson arrivals per point")
    found = searches(traces, designs, args.duration_s, args.seed, args.budget_h100, args.jobs)
    print(f"{'trace':>5} {'design':>7} {'machines':>9} {'kW prov':>7} {'$/h':>5} {'req/s@SLO':>9} {'x base-H':>8} "
          f"{'x own base':>10} {'kW mean':>7} {'req/s/$h':>8} {'TTFT p99':>8} {'TBT p50':>7} {'E2E p90':>7} "
          f"{'runs':>5}")
    for trace in traces:
        for name in designs:
            s = found[(trace, name)]
            o = s.best
            if o is None:
                print(f"{trace:>5} {name:>7}  meets the SLOs at no rate tried")
                continue
            base_h = found.get((trace, "base-H"))
            base_own = found.get((trace, "base-" + DESIGNS[name].prompt.name))
            ratio = f"{o.rate_rps / base_h.best.rate_rps:>8.2f}" if base_h and base_h.best else f"{'-':>8}"
            ratio_own = f"{o.rate_rps / base_own.best.rate_rps:>10.2f}" if base_own and base_own.best else f"{'-':>10}"
            machines = f"{o.prompt}P+{o.token}T" if o.token else f"{o.prompt} mixed"
            print(f"{trace:>5} {name:>7} {machines:>9} {o.power_kw:>7.1f} {o.cost_per_hour:>5.0f} {o.rate_rps:>9.2f} "
                  f"{ratio} {ratio_own} {o.mean_power_kw:>7.1f} {o.rate_rps / o.cost_per_hour:>8.3f} "
                  f"{o.slowdowns['ttft'][99]:>7.2f}x {o.slowdowns['tbt'][50]:>6.2f}x {o.slowdowns['e2e'][90]:>6.2f}x "
                  f"{s.runs:>5}  ({s.seconds:.0f} s)")
    return 0
