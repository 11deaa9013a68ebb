"""Splitwise-HH and -HHcap vs the mixed-batching baseline in the simulator, and the
provisioning search, on the Azure conversation and code traces.

    wattwise bench splitwise [--duration-s 600] [--cap-w 350] [--slo 0.95]

HHcap caps the token pool's GPUs at `--cap-w` (PerfModel.clock_under_power_cap). All
rows of a trace come from the same run of this command; ratios are vs singlepool.
"""

from __future__ import annotations

import argparse

from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.run import simulate
from sim.splitwise_plan import plan_splitwise, run_splitwise
from sim.workload import fit_context, load_trace, window


def row(trace: str, name: str, r: dict, base: dict, duration_s: float) -> str:
    power_w = r["energy_j"] / r["duration_s"]
    return (f"{trace:>5} {name:>12} {r['completed'] / duration_s:>7.2f} {r['slo_attainment']['overall'] * 100:>6.1f} "
            f"{r['peak_gpus']:>5} {r['cost_usd']:>7.2f} {r['energy_kwh']:>7.2f} {power_w / 1e3:>6.1f} "
            f"{r['energy_j'] / base['energy_j']:>7.2f} {r['cost_usd'] / base['cost_usd']:>7.2f} {r['p99_ttft_s']:>6.2f} "
            f"{r['p99_tbt_s']:>6.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench splitwise", description=__doc__)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--cap-w", type=float, default=350.0, help="per-GPU power cap of HHcap's token pool")
    p.add_argument("--slo", type=float, default=0.95, help="SLO attainment the provisioning search must reach")
    p.add_argument("--max-machines", type=int, default=6, help="per pool, for the search")
    args = p.parse_args(argv)
    config = SimConfig()
    cap_clock = default_perf_model().clock_under_power_cap("token", args.cap_w)
    print(f"HHcap token clock under {args.cap_w:.0f} W/GPU: {cap_clock:.0f} MHz")
    print(f"{'trace':>5} {'system':>12} {'req/s':>7} {'SLO %':>6} {'GPUs':>5} {'cost $':>7} {'kWh':>7} {'kW':>6} "
          f"{'x energy':>7} {'x cost':>7} {'p99 TTFT':>6} {'p99 TBT':>6}")
    for trace in ("conv", "code"):
        w = fit_context(window(load_trace(trace), 0.0, args.duration_s), 8192)
        base = simulate("singlepool", w, config)[0]
        hh = run_splitwise(w, config)[0]
        hhcap = run_splitwise(w, config, token_clock_mhz=cap_clock)[0]
        for name, r in (("singlepool", base), ("HH", hh), ("HHcap", hhcap)):
            print(row(trace, name, r, base, w.duration_s))
    for trace in ("conv", "code"):
        w = fit_context(window(load_trace(trace), 0.0, args.duration_s), 8192)
        for name, clock in (("HH", None), ("HHcap", cap_clock)):
            best, trials = plan_splitwise(w, config, args.slo, args.max_machines, args.max_machines, clock)
            found = f"{best.prompt}P + {best.token}T, ${best.cost:.0f}/h" if best else "none in the grid"
            print(f"plan {trace:>5} {name:>6}: {found} (SLO >= {args.slo:.0%}; {len(trials)} runs)")
    return 0
