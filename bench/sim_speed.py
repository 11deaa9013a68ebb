"""Simulator speed: requests simulated per wall second, per policy.

    python bench/sim_speed.py                 # 1 h conversation trace, every baseline
    python bench/sim_speed.py --synthetic-hours 24   # plus a synthetic run at the same rate

Target (issue #3): the 1 h conversation trace in <= 10 s per policy on one core, a
synthetic week in <= 10 min.
"""

from __future__ import annotations

import argparse

import numpy as np

from sim.config import SimConfig
from sim.run import simulate
from sim.scenario import SPECS
from sim.workload import fit_context, load_trace, synthetic


def row(name: str, policy: str, w, config: SimConfig) -> str:
    s, _ = simulate(policy, w, config)
    return f"{name:>12} {policy:>18} {len(w):>9} {s['wall_s']:>8.1f} {len(w) / s['wall_s']:>10.0f} {s['completed']:>9}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench sim-speed", description=__doc__)
    p.add_argument("--synthetic-hours", type=float, default=6.0)
    p.add_argument("--synthetic-policy", default="singlepool")
    args = p.parse_args(argv)
    config = SimConfig()
    conv = fit_context(load_trace("conv"), 8192)
    print(f"{'workload':>12} {'policy':>18} {'requests':>9} {'wall s':>8} {'req/s':>10} {'completed':>9}")
    for policy in SPECS:
        print(row("conv 1h", policy, conv, config), flush=True)
    if args.synthetic_hours > 0:
        rate = len(conv) / conv.duration_s
        w = synthetic(rate, args.synthetic_hours * 3600, np.random.default_rng(0), lengths_from=conv)
        print(row(f"synth {args.synthetic_hours:g}h", args.synthetic_policy, fit_context(w, 8192), config), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
