"""Splitwise's provisioning question for one length-class pool of the one controller: does
it pay to serve the pool as prompt + token replicas instead of unified ones?

    wattwise bench phase-split [--traces conv,code] [--tp 2] [--replicas 2,3,4] [--jobs 2]

The pool is the long-input one (prompts >= `input_medium_lt` tokens, every output length):
the pool Splitwise's split is for. Its requests run on n replicas of one TP, unified (each
step's prefill chunked to the tightest TBT target, interactive first: the composite's
replicas) and split p + (n - p) for every p (Splitwise's prompt batching, JSQ over pending
tokens, KV over the modelled link, KV-budget admission on token replicas). Every replica
runs throttLL'eM's admission and per-step clock, and the counts stay fixed: the comparison
is the phase split alone, at equal GPUs, not the planner. The clock band brackets what the
planner would publish: "top" pins every replica at the GPU's top clock (the band's floor at
its highest), "open" lets throttLL'eM's clock search the GPU's whole range (no floor).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autoscaling.splitwise.config import SplitwiseConfig
from bench.run_header import run_header
from bench.wattwise import workload
from core.classes import LengthClassConfig
from core.plan import ClusterPlan
from core.roles import Phase
from core.view import ClusterView
from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import with_throttllem
from sim.simulator import PoolSetup, Simulator
from sim.splitwise import SplitwiseSimulator

ALL_CLASSES = tuple(LengthClassConfig.names())


class FixedPools:
    """The given replicas per pool, every pool's clock in one band."""

    def __init__(self, setups: list[PoolSetup], band_mhz: tuple[int, int]) -> None:
        self.plan = ClusterPlan(replicas={s.name: s.replicas for s in setups},
                                clock_band_mhz={s.name: band_mhz for s in setups}, reason="fixed pools")

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        return self.plan


def layouts(tp: int, replicas: int, top_mhz: float, step_s: float) -> list[tuple[str, list[PoolSetup]]]:
    """Unified, then every prompt + token split of `replicas` replicas."""
    out = [(f"unified {replicas}", [PoolSetup("pool-long", ALL_CLASSES, tp, top_mhz, replicas,
                                              step_time_target_s=step_s, interactive_first=True)])]
    for prompt in range(1, replicas):
        out.append((f"split {prompt} + {replicas - prompt}", [
            PoolSetup("pool-prompt", ALL_CLASSES, tp, top_mhz, prompt, kind=Phase.PROMPT,
                      max_batched_tokens=SplitwiseConfig().prompt_batch_tokens),
            PoolSetup("pool-token", ALL_CLASSES, tp, top_mhz, replicas - prompt, kind=Phase.TOKEN)]))
    return out


def run_one(job: tuple[str, int, int, int]) -> list[dict[str, Any]]:
    trace, tp, replicas, seed = job
    config = SimConfig()
    lengths = LengthClassConfig()
    w = workload(trace, 24.0, seed)
    w = w.take(w.prompt_tokens >= lengths.input_medium_lt)
    gpu = default_perf_model(config.model, config.hardware, config.profile).gpu
    step_s = min(lengths.slo(c).tbt_s for c in ALL_CLASSES)
    bands = {"top": (gpu.max_clock_mhz, gpu.max_clock_mhz), "open": (gpu.min_clock_mhz, gpu.max_clock_mhz)}
    rows = []
    for band, clocks in bands.items():
        for name, setups in layouts(tp, replicas, float(gpu.max_clock_mhz), step_s):
            setups = with_throttllem(setups, config)
            simulator = SplitwiseSimulator if any(s.kind is not None for s in setups) else Simulator
            raw = simulator(w, FixedPools(setups, clocks), setups, config).run()
            log = raw.log
            rows.append({"trace": trace, "band": band, "layout": name, "requests": len(w), **summarise(raw, config),
                         "ttft_misses": int((log.ttft_s > log.slo_ttft_s).sum()),
                         "tbt_misses": int((log.mean_tbt_s > log.slo_tbt_s).sum())})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="conv,code")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--replicas", default="2,3,4", help="Replica counts to compare at (each >= 2).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    print(run_header("wattwise bench phase-split " + " ".join(argv or [])).markdown())
    counts = [int(n) for n in args.replicas.split(",")]
    if min(counts) < 2:
        p.error("--replicas: a split needs at least one prompt and one token replica")
    jobs = [(trace, args.tp, n, args.seed) for trace in args.traces.split(",") for n in counts]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_one, jobs))
    print(f"\nLong-input requests only, TP{args.tp}, replicas fixed, throttLL'eM's hooks on every replica.\n")
    print("| trace | clock band | layout | GPUs | kWh | x unified | SLO met | TTFT misses | TBT misses | p99 TTFT s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (trace, tp, n, _), rows in zip(jobs, results, strict=True):
        unified_kwh = {r["band"]: r["energy_kwh"] for r in rows if r["layout"].startswith("unified")}
        for r in rows:
            print(f"| {trace} ({r['requests']} requests) | {r['band']} | {r['layout']} | {n * tp} | "
                  f"{r['energy_kwh']:.3f} | {r['energy_kwh'] / unified_kwh[r['band']]:.2f} | "
                  f"{r['slo_attainment']['overall']:.2%} | {r['ttft_misses']} | {r['tbt_misses']} | "
                  f"{r['p99_ttft_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
