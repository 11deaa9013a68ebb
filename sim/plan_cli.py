"""`wattwise plan`: Splitwise provisioning for a trace, SLOs and a goal (sim/provision.py).

    wattwise plan --trace code --goal cost --designs HH,HHcap,AA,HA --plot out/plan.png
    wattwise plan --trace conv --goal throughput --budget-kw 45.5 --designs HH,HHcap,base-H
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Literal

import numpy as np

from sim.provision import (
    DESIGNS,
    Outcome,
    Runs,
    SlowdownSLO,
    at_rate,
    plot_search_space,
    plot_throughput_splits,
    rank,
    search_design,
    search_throughput,
)
from sim.workload import Workload, fit_context, load_trace, synthetic, window


def _limits(text: str) -> tuple[float, float, float]:
    parts = tuple(float(x) for x in text.split(","))
    if len(parts) != 3 or min(parts) <= 0:
        raise argparse.ArgumentTypeError("give three positive slowdown limits: P50,P90,P99")
    return parts


def describe(o: Outcome) -> str:
    return (f"{o.design:>6} {o.prompt:>3}P + {o.token:>3}T  {o.rate_rps:>7.2f} req/s  ${o.cost_per_hour:>7.0f}/h  "
            f"{o.power_kw:>6.1f} kW prov.  {o.mean_power_kw:>6.1f} kW mean  "
            f"TTFT p50/p99 {o.slowdowns['ttft'][50]:.2f}/{o.slowdowns['ttft'][99]:.2f}x  "
            f"TBT {o.slowdowns['tbt'][50]:.2f}/{o.slowdowns['tbt'][99]:.2f}x  "
            f"E2E {o.slowdowns['e2e'][50]:.2f}/{o.slowdowns['e2e'][99]:.2f}x"
            + ("" if o.meets_slo else f"  VIOLATES {', '.join(o.violations)}"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="code", help="conv | code | a CSV like the Azure traces")
    p.add_argument("--start-s", type=float, default=0.0)
    p.add_argument("--duration-s", type=float, default=300.0, help="window of the trace to simulate")
    p.add_argument("--arrivals", choices=("poisson", "trace"), default="poisson",
                   help="poisson: Poisson arrivals with the window's prompt/output sizes (Splitwise §V-B); "
                        "trace: the window's own timestamps")
    p.add_argument("--rps", type=float, help="Poisson rate (default: the window's mean rate)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace arrivals: replay this many times faster")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goal", choices=("cost", "power", "throughput"), default="cost")
    p.add_argument("--designs", default="HH,HHcap,AA,HA",
                   help=f"comma-separated, of {','.join(DESIGNS)} (base-*: mixed-batching pools)")
    p.add_argument("--max-prompt", type=int, default=12, help="most prompt (or baseline) machines to try")
    p.add_argument("--max-token", type=int, default=12)
    p.add_argument("--budget-kw", type=float, help="throughput goal: provisioned-power budget")
    p.add_argument("--budget-usd-h", type=float, help="throughput goal: cost budget per hour")
    p.add_argument("--slo-ttft", type=_limits, default=SlowdownSLO().ttft, help="P50,P90,P99 slowdown limits")
    p.add_argument("--slo-tbt", type=_limits, default=SlowdownSLO().tbt)
    p.add_argument("--slo-e2e", type=_limits, default=SlowdownSLO().e2e)
    p.add_argument("--top", type=int, default=5, help="alternatives to print")
    p.add_argument("--plot", default="out/splitwise_plan.png", help="PNG of the search space (cost/power goals)")
    args = p.parse_args(argv)
    names = args.designs.split(",")
    unknown = [n for n in names if n not in DESIGNS]
    if unknown:
        p.error(f"unknown designs {unknown}; known: {', '.join(DESIGNS)}")
    if args.goal == "throughput" and (args.budget_kw is None) == (args.budget_usd_h is None):
        p.error("the throughput goal needs exactly one of --budget-kw or --budget-usd-h")
    w = fit_context(window(load_trace(args.trace), args.start_s, args.duration_s), 8192)
    if len(w) < 2:
        p.error("the trace window holds fewer than two requests")
    make_workload = None
    if args.arrivals == "poisson":
        sizes, rps = w, args.rps or len(w) / w.duration_s

        def make_workload(factor: float) -> Workload:  # Poisson at factor x rps over the whole span
            return synthetic(rps * factor, args.duration_s, np.random.default_rng(args.seed), lengths_from=sizes)

        w = make_workload(1.0)
    else:  # the throughput goal replays the window faster
        w = at_rate(w, args.rate_scale)
    slo = SlowdownSLO(ttft=args.slo_ttft, tbt=args.slo_tbt, e2e=args.slo_e2e)
    runs = Runs(w, slo, make_workload=make_workload)
    started = time.perf_counter()
    print(f"trace {args.trace}: {len(w)} requests over {w.duration_s:.0f} s ({len(w) / w.duration_s:.2f} req/s), "
          f"goal {args.goal}, SLO slowdowns TTFT {slo.ttft} TBT {slo.tbt} E2E {slo.e2e} vs an unloaded DGX-A100")
    if args.goal == "throughput":
        kind: Literal["power", "cost"] = "power" if args.budget_kw is not None else "cost"
        limit = args.budget_kw if args.budget_kw is not None else args.budget_usd_h
        found = [o for n in names for o in search_throughput(runs, DESIGNS[n], kind, limit, args.max_prompt)]
        searches = []
    else:
        searches = [search_design(runs, DESIGNS[n], args.goal, args.max_prompt, args.max_token) for n in names]
        found = [o for s in searches for o in s.candidates]
    ranked = rank(found, args.goal)
    print(f"{len(runs.cache)} simulations in {time.perf_counter() - started:.1f} s")
    if not ranked:
        print("no configuration in the search range meets the SLOs", file=sys.stderr)
        return 1
    print("optimum:      " + describe(ranked[0]))
    for o in ranked[1:args.top + 1]:
        print("alternative:  " + describe(o))
    if args.goal == "throughput" and any(o.token for o in found):
        plot_throughput_splits(found, args.plot, ranked[0], f"{args.trace}: most req/s within {limit:g} "
                               f"{'kW' if kind == 'power' else '$/h'}")
        print(f"wrote {args.plot}")
    elif any(s.design.split for s in searches):
        plot_search_space(searches, args.goal, args.plot, ranked[0],
                          f"{args.trace} at {len(w) / w.duration_s:.1f} req/s, goal {args.goal}")
        print(f"wrote {args.plot}")
    return 0
