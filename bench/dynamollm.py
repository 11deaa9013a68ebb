"""DynamoLLM on the Azure conversation trace vs the baselines and the oracle, plus the
pool manager's MILP solve time for pools of 8-64 GPUs.

    wattwise bench dynamollm [--duration-s 3600]

Targets (issue #4): energy <= 45% of SinglePool at >= 99% SLO attainment per class;
MILP solve p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from autoscaling.dynamollm.pool_manager import solve_pool
from core.classes import LengthClassConfig
from energy.calibration import default_perf_model
from energy.profile_builder import build_profile
from sim.config import SimConfig
from sim.metrics import J_PER_KWH
from sim.oracle import oracle_energy
from sim.run import simulate
from sim.workload import fit_context, load_trace, window

POLICIES = ("singlepool", "multipool", "scaleinst", "scaleshard", "scalefreq", "dynamollm")


def policy_table(duration_s: float | None) -> None:
    w = fit_context(window(load_trace("conv"), 0.0, duration_s), 8192)
    config = SimConfig()
    rows = [simulate(p, w, config)[0] for p in POLICIES]
    oracle = oracle_energy(w, config)
    base = rows[0]["energy_j"]
    print(f"conversation trace: {len(w)} requests over {w.duration_s:.0f} s")
    print(f"{'policy':>12} {'kWh':>7} {'x single':>9} {'GPU-h':>7} {'SLO %':>6} {'worst class':>13} {'p99 TTFT s':>10}")
    for r in rows:
        per_class = {k: v for k, v in r["slo_attainment"].items() if len(k) == 2}
        worst = min(per_class, key=per_class.__getitem__)
        print(f"{r['policy']:>12} {r['energy_kwh']:>7.2f} {r['energy_j'] / base:>9.2f} {r['gpu_hours']:>7.1f} "
              f"{r['slo_attainment']['overall'] * 100:>6.1f} {worst:>4} {per_class[worst] * 100:>7.1f}% "
              f"{r['p99_ttft_s']:>10.2f}")
    print(f"{'oracle':>12} {oracle.energy_j / J_PER_KWH:>7.2f} {oracle.energy_j / base:>9.2f} {oracle.gpu_hours:>7.1f}")


def milp_times(repeats: int = 20) -> None:
    profile = build_profile(default_perf_model())
    lengths = LengthClassConfig()
    print(f"\n{'GPUs':>5} {'solver':>12} {'p50 ms':>8} {'p99 ms':>8}  (MM at 60% of the pool's capacity)")
    for gpus in (8, 16, 32, 64):
        load = 0.6 * gpus / 8 * profile.max_rate_per_s("MM", 8, 1980)
        for label, max_clock_only in (("full eq. 1", False), ("max clock", True)):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                solve_pool(profile, "MM", load, gpus, lengths.slo("MM"), max_clock_only=max_clock_only)
                times.append((time.perf_counter() - t0) * 1000)
            print(f"{gpus:>5} {label:>12} {np.percentile(times, 50):>8.1f} {np.percentile(times, 99):>8.1f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench dynamollm", description=__doc__)
    p.add_argument("--duration-s", type=float, default=None, help="window of the trace (default: all of it)")
    p.add_argument("--milp-repeats", type=int, default=20)
    args = p.parse_args(argv)
    policy_table(args.duration_s)
    milp_times(args.milp_repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
