"""Would Chiron's local autoscaler (Algorithm 1) pay as a layer of the one controller?

    python -m bench.local_autoscaler_layer [--traces conv,code] [--duration-s 1800]

The composite (`wattwise`) on the first half hour of each trace (the tuning halves), with
and without Algorithm 1 owning every replica's batch limit, in two worlds: the replicas run
the profile the controllers plan with, and they run a slower one (Splitwise's 2023 fit,
1.8-3.3x slower per step) while the planner and throttLL'eM still believe the default. The
second is where a layer driven by measured ITL rather than by the model could earn its
place: it sees the engine's real step times. A third world, the slower replicas with the
controllers planning on their profile, bounds what correcting the planner's model could win.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from autoscaling.chiron.local import LocalAutoscalerConfig
from bench.run_header import run_header
from energy.calibration import default_perf_model
from sim.cli import window
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import build
from sim.simulator import Simulator
from sim.workload import load_trace

SLOWER_PROFILE = "splitwise-llama2-70b-h100"


def run(trace: str, duration_s: float, replicas_profile: str | None, local: bool, planned_on_it: bool = False) -> dict:
    config = SimConfig(profile=replicas_profile if planned_on_it else None)
    w = window(load_trace(trace), 0.0, duration_s)
    pools, controller = build("wattwise", w, config)
    if local:
        pools = [replace(p, local_autoscaler=LocalAutoscalerConfig()) for p in pools]
    perf = default_perf_model(config.model, config.hardware, replicas_profile) if replicas_profile else None
    return summarise(Simulator(w, controller, pools, config, perf=perf).run(), config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="conv,code")
    p.add_argument("--duration-s", type=float, default=1800.0)
    args = p.parse_args(argv)
    print(run_header("python -m bench.local_autoscaler_layer " + " ".join(argv or [])).markdown())
    print("\n| trace | replicas run | Algorithm 1 | J / gen. token | GPU-h | SLO | p99 TTFT s | p99 mean TBT s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for trace in args.traces.split(","):
        for world, profile in (("the planned profile", None), (f"{SLOWER_PROFILE} (slower)", SLOWER_PROFILE)):
            for local in (False, True):
                s = run(trace, args.duration_s, profile, local)
                print(f"| {trace} 0-{args.duration_s:.0f} s | {world} | {'on' if local else 'off'} | "
                      f"{s['j_per_token']:.2f} | {s['gpu_hours']:.2f} | {s['slo_attainment']['overall']:.1%} | "
                      f"{s['p99_ttft_s']:.2f} | {s['p99_tbt_s']:.3f} |", flush=True)
        s = run(trace, args.duration_s, SLOWER_PROFILE, local=False, planned_on_it=True)
        print(f"| {trace} 0-{args.duration_s:.0f} s | the slower one, planned on it | off | {s['j_per_token']:.2f} | "
              f"{s['gpu_hours']:.2f} | {s['slo_attainment']['overall']:.1%} | {s['p99_ttft_s']:.2f} | "
              f"{s['p99_tbt_s']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
