"""The one controller when its profile is wrong: trusting it, or following measured step times.

    wattwise bench measured-speed [--traces conv,code] [--start-s 1800] [--duration-s 1800] [--jobs 2]

The planner costs shapes on a perf/power profile; the engines may run slower or faster.
Each world runs the composite (`wattwise`) on the same window with replicas whose steps
follow one profile while the planner and throttLL'eM believe another:

- as planned: both on the default (`mlenergy-llama3-70b-h100`), the reference row;
- slower: replicas on Splitwise's 2023 fit (per step: decode 1.5-1.8x slower at TP2, 2.5-4x at
  TP8; prefill 2.8x), the planner on the default;
- faster: the reverse, the planner on Splitwise's fit, the replicas on the default;

each with the planner trusting its profile (`follow_measured_speed: false`) and following the
step times its replicas measure against it (the default, batching.step_speed), and the
planner on the replicas' own profile as the bound of what a perfect correction could win.
The window defaults to the second half hour of each trace: nothing in the correction was
chosen on it (the deadband and the step decay were set before any run).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from autoscaling.dynamollm.shape_planner import ShapePlannerConfig
from bench.run_header import run_header
from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import build
from sim.simulator import Simulator
from sim.workload import load_trace, window

DEFAULT_PROFILE = "mlenergy-llama3-70b-h100"
SPLITWISE_PROFILE = "splitwise-llama2-70b-h100"


@dataclass(frozen=True)
class World:
    name: str
    replicas_profile: str  # what the engines' steps follow
    planned_profile: str  # what the planner and throttLL'eM believe
    follow: bool  # the planner follows measured step times


WORLDS = (
    World("as planned", DEFAULT_PROFILE, DEFAULT_PROFILE, True),
    World("slower, trusting the profile", SPLITWISE_PROFILE, DEFAULT_PROFILE, False),
    World("slower, following measured speed", SPLITWISE_PROFILE, DEFAULT_PROFILE, True),
    World("slower, planned on their own profile", SPLITWISE_PROFILE, SPLITWISE_PROFILE, True),
    World("faster, trusting the profile", DEFAULT_PROFILE, SPLITWISE_PROFILE, False),
    World("faster, following measured speed", DEFAULT_PROFILE, SPLITWISE_PROFILE, True),
)


def run_one(job: tuple[str, World, float, float]) -> dict[str, Any]:
    trace, world, start_s, duration_s = job
    config = SimConfig(profile=world.planned_profile)
    w = window(load_trace(trace), start_s, duration_s)
    settings = None if world.follow else {"planner": ShapePlannerConfig(follow_measured_speed=False)}
    pools, policy = build("wattwise", w, config, wattwise_settings=settings)
    perf = default_perf_model(config.model, config.hardware, world.replicas_profile)
    raw = Simulator(w, policy, pools, config, perf=perf).run()
    ratios = [r.batcher.speed.ratio for r in raw.replicas if r.batcher is not None and r.batcher.speed is not None
              and r.batcher.speed.ratio > 0]  # replicas that timed a step
    return {"trace": trace, "world": world.name, **summarise(raw, config),
            "step_time_ratio": sum(ratios) / len(ratios) if ratios else 1.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="conv,code")
    p.add_argument("--start-s", type=float, default=1800.0)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    print(run_header("wattwise bench measured-speed " + " ".join(argv or [])).markdown())
    jobs = [(trace, world, args.start_s, args.duration_s) for trace in args.traces.split(",") for world in WORLDS]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, jobs))
    end_s = args.start_s + args.duration_s
    print("\n| trace | world | measured step-time ratio | J / gen. token | GPU-h | SLO | worst class | p99 TTFT s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        classes = {k: v for k, v in r["slo_attainment"].items() if len(k) == 2 and k.isupper()}
        worst = min(classes, key=classes.__getitem__)
        print(f"| {r['trace']} {args.start_s:.0f}-{end_s:.0f} s | {r['world']} | {r['step_time_ratio']:.2f} | "
              f"{r['j_per_token']:.2f} | {r['gpu_hours']:.2f} | {r['slo_attainment']['overall']:.2%} | "
              f"{worst} {classes[worst]:.1%} | {r['p99_ttft_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
