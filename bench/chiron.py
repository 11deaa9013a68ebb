"""Chiron's W_A and W_B in the simulator vs the Llumnix-like utilisation autoscaler and
static batch sizes, plus the local autoscaler's convergence time.

    wattwise bench chiron [--duration-s 900] [--rate 6] [--batch-requests 3000]

W_A: interactive Poisson arrivals with conversation-trace lengths. W_B: the same plus a
queue of batch requests dumped at t = 60 s. Interactive requests keep the DynamoLLM
class targets tightened onto Chiron's (TTFT 10 s / ITL 200 ms); batch ones Chiron's
1 h / 2 s. Target (issue #5): >= 95% SLO attainment with <= 40% of the baseline's
GPU-hours on W_B.
"""

from __future__ import annotations

import argparse

import numpy as np

from autoscaling.chiron.local import LocalAutoscalerConfig, LocalBatchAutoscaler
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.run import simulate
from sim.workload import batch_dump, fit_context, load_trace, synthetic

POLICIES = ("llumnix", "multipool", "chiron")


def workloads(duration_s: float, rate: float, batch_requests: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    conv = load_trace("conv")
    wa = fit_context(synthetic(rate, duration_s, rng, lengths_from=conv), 8192)
    wb = fit_context(batch_dump(wa, batch_requests, 60.0, rng), 8192)
    return {"W_A": wa, "W_B": wb}


def policy_table(duration_s: float, rate: float, batch_requests: int, seed: int) -> None:
    config = SimConfig()
    print(f"{'workload':>8} {'policy':>10} {'SLO %':>6} {'inter %':>8} {'batch %':>8} {'GPU-h':>7} {'x GPU-h':>8} "
          f"{'req/GPU-h':>10} {'hysteresis':>10}")
    for name, w in workloads(duration_s, rate, batch_requests, seed).items():
        rows = [simulate(p, w, config)[0] for p in POLICIES]
        base = rows[0]["gpu_hours"]
        for r in rows:
            slo = r["slo_attainment"]
            print(f"{name:>8} {r['policy']:>10} {slo['overall'] * 100:>6.1f} {slo.get('interactive', 0) * 100:>8.1f} "
                  f"{slo.get('batch', float('nan')) * 100:>8.1f} {r['gpu_hours']:>7.2f} {r['gpu_hours'] / base:>8.2f} "
                  f"{r['completed'] / r['gpu_hours']:>10.0f} {r.get('hysteresis', float('nan')):>10.2f}")


def convergence_s(rate: float = 6.0, seed: int = 0, horizon_s: float = 300.0) -> tuple[float, int]:
    """Seconds until one replica's batch limit stays within 10% of where it ends up."""
    perf = default_perf_model()
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * horizon_s)))
    auto = LocalBatchAutoscaler(LocalAutoscalerConfig())
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=8, batch_limit=auto.limit))
    slo = SLO(ttft_s=10, tbt_s=0.2)
    limits, t, i, next_update = [], 0.0, 0, 1.0
    while t < horizon_s:
        while i < len(arrivals) and arrivals[i] <= t:
            b.add(Request(str(i), 1000, 200, float(arrivals[i]), slo), float(arrivals[i]))
            i += 1
        step = b.plan_step(t)
        t = b.finish_step(step).end_s if step else float(arrivals[i]) if i < len(arrivals) else horizon_s
        if t >= next_update:
            s = b.stats(t)
            b.set_batch_limit(auto.update(s.itl_ewma_s, slo.tbt_s, s.tokens_per_s, s.running_requests,
                                          s.tokens_generated))
            limits.append((t, auto.limit))
            next_update += 1.0
    final = limits[-1][1]
    settled = next((t for t, _ in limits if all(abs(lim - final) <= 0.1 * final for _, lim in
                                                 [x for x in limits if x[0] >= t])), horizon_s)
    return settled, final


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench chiron", description=__doc__)
    p.add_argument("--duration-s", type=float, default=900.0)
    p.add_argument("--rate", type=float, default=6.0, help="interactive requests/s")
    p.add_argument("--batch-requests", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    policy_table(args.duration_s, args.rate, args.batch_requests, args.seed)
    settled, final = convergence_s()
    print(f"\nlocal autoscaler: batch limit settles at {final} after {settled:.0f} s "
          "(TP8, 6 req/s of 1000+200 tokens, ITL SLO 200 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
