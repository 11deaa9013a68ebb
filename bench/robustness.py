"""The composite against the strongest operator baseline where nothing was tuned (issue #68, item 5).

    wattwise bench robustness [--variants NAME,...] [--duration-s 1800] [--jobs 2] [--json out.json]

Each variant changes one thing from the default run (conv's first half hour on the default
profile): the profile (Splitwise's 2023 sweeps of H100 and A100; a B200), the model (BLOOM-176B,
Llama-3.1-8B), the load (code on Splitwise's profile; conv at 1.7x its rate; a synthetic hour
with inter-arrival CV 3; another seed's 24 h day, shortened to --day-hours), or
the GPU's fitted clock physics (each leave-one-out refit of energy.clock_fit: the range the
fit's uncertainty spans). Per variant: the composite, SinglePool and the three operator
baselines in one run; the composite's energy over the strongest baseline's (the least energy
among those meeting 99% in every class, else the best worst class), and every worst class.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.wattwise import OPERATOR_BASELINES, strongest_baseline
from energy.hardware import GPUS, MODELS
from sim.config import SimConfig
from sim.metrics import worst_class
from sim.run import simulate
from sim.workload import Workload, diurnal, fit_context, load_trace, scale_rate, synthetic, window

POLICIES = ("singlepool", *OPERATOR_BASELINES, "wattwise")
# energy.clock_fit's refits without each of its three measurements (`wattwise bench model-check
# --leave-one-out`, docs/results/2026-12-06-model-check.md).
REFITS: dict[str, dict[str, float]] = {
    "refit without DynamoLLM's tables": {
        "token_compute_share": 0.4333, "roofline_sharpness": 14.2093, "prompt_compute_share": 0.8088,
        "prompt_core_power_share": 0.8073, "voltage_floor": 0.55, "token_core_power_share": 0.3927,
        "voltage_knee": 0.6714},
    "refit without Splitwise's power cap": {
        "token_compute_share": 0.3817, "roofline_sharpness": 16.0, "prompt_compute_share": 1.0,
        "prompt_core_power_share": 0.1, "voltage_floor": 0.55, "token_core_power_share": 0.1,
        "voltage_knee": 0.6061},
    "refit without throttLL'eM's A100": {
        "token_compute_share": 0.407, "roofline_sharpness": 16.0, "prompt_compute_share": 0.5,
        "prompt_core_power_share": 0.725, "voltage_floor": 0.55, "token_core_power_share": 0.1373,
        "voltage_knee": 0.6313},
}


@dataclass(frozen=True)
class Variant:
    name: str
    trace: str = "conv"  # conv | code | synthetic-cv3 | day
    rate_scale: float = 1.0
    profile: str | None = None
    hardware: str = "h100-80gb"
    model: str = "llama2-70b"
    seed: int = 0
    physics: dict[str, float] = field(default_factory=dict)  # GpuSpec fields replaced


VARIANTS = (
    Variant("default"),
    Variant("Splitwise's profile", profile="splitwise-llama2-70b-h100"),
    Variant("B200", profile="mlenergy-llama3-70b-b200", hardware="b200-180gb"),
    Variant("A100 (Splitwise's profile)", profile="splitwise-llama2-70b-a100", hardware="a100-80gb"),
    Variant("code on Splitwise's profile", trace="code", profile="splitwise-llama2-70b-h100"),
    Variant("BLOOM-176B (Splitwise's profile)", profile="splitwise-bloom-176b-h100", model="bloom-176b"),
    Variant("Llama-3.1-8B", profile="mlenergy-llama3.1-8b-h100", model="llama3.1-8b"),
    Variant("conv at 1.7x its rate", rate_scale=1.7),
    Variant("synthetic, CV 3", trace="synthetic-cv3"),
    Variant("another day (seed 1)", trace="day", seed=1),
    *(Variant(name, physics=physics) for name, physics in REFITS.items()),
)


def workload(v: Variant, duration_s: float, day_hours: float) -> Workload:
    """The variant's requests, prompts and outputs clipped to its model's context."""
    rng = np.random.default_rng(v.seed)
    conv = load_trace("conv")
    if v.trace == "synthetic-cv3":
        w = synthetic(conv.arrival_s.size / conv.arrival_s[-1], duration_s, rng, cv=3.0, lengths_from=conv)
    elif v.trace == "day":
        w = diurnal(2.0, day_hours, 10.0, rng, conv)
    else:
        w = window(load_trace(v.trace), 0.0, duration_s)
    if v.rate_scale != 1.0:
        w = scale_rate(w, v.rate_scale, rng)
    return fit_context(w, MODELS[v.model].max_context_tokens)


def run_one(job: tuple[Variant, str, float, float]) -> dict[str, Any]:
    variant, policy, duration_s, day_hours = job
    if variant.physics:  # in this worker process only: every perf model built here reads it
        GPUS[variant.hardware] = GPUS[variant.hardware].model_copy(update=variant.physics)
    config = SimConfig(hardware=variant.hardware, profile=variant.profile, model=variant.model)
    try:
        summary, _ = simulate(policy, workload(variant, duration_s, day_hours), config)
    except ValueError as exc:  # a policy that cannot run on the profile (SinglePool's TP8 on B200's TP2)
        return {"variant": variant.name, "policy": policy, "error": str(exc)}
    return {"variant": variant.name, **{k: v for k, v in summary.items() if k != "series"}}


def verdict(name: str, results: list[dict[str, Any]]) -> str:
    rows = [r for r in results if "error" not in r]
    skipped = "".join(f"; {r['policy']} cannot run: {r['error']}" for r in results if "error" in r)
    ours = next((r for r in rows if r["policy"] == "wattwise"), None)
    if ours is None:
        return f"{name}: the composite cannot run{skipped}"
    best = strongest_baseline(rows)
    classes = ", ".join(f"{r['policy']} {worst_class(r)[0]} {worst_class(r)[1] * 100:.1f}%" for r in rows)
    if best is None:
        return f"{name}: no operator baseline ran"
    return (f"{name}: composite x {best['policy']} energy {ours['energy_j'] / best['energy_j']:.2f}, "
            f"GPU-hours {ours['gpu_hours'] / best['gpu_hours']:.2f}; worst classes: {classes}{skipped}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench robustness", description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=None, help="comma-separated names (default: all)")
    p.add_argument("--duration-s", type=float, default=1800.0, help="conv/synthetic window")
    p.add_argument("--day-hours", type=float, default=6.0, help="the day variant's length (its first hours)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    chosen = [v for v in VARIANTS if args.variants is None or v.name in args.variants.split(",")]
    jobs = [(v, policy, args.duration_s, args.day_hours) for v in chosen for policy in POLICIES]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs, max_tasks_per_child=1) as pool:
        results = list(pool.map(run_one, jobs))
    for v in chosen:
        print(verdict(v.name, [r for r in results if r["variant"] == v.name]))
    print(f"{len(jobs)} simulations in {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
