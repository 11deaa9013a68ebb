"""`wattwise simulate`: replay a trace through policies and compare them side by side."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import numpy as np

from core.overheads import OverheadTable
from energy.hardware import GPUS, MODELS
from energy.profiles import PROFILE_NAMES
from sim.config import ReplicaRouter, SimConfig
from sim.held_capacity import Floors
from sim.metrics import J_PER_KWH, worst_class
from sim.multi_turn import multi_turn
from sim.run import simulate
from sim.scenario import SPECS
from sim.workload import (
    TRACES,
    Workload,
    fit_context,
    load_trace,
    scale_rate,
    scale_time,
    synthetic,
    window,
    with_batch_fraction,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wattwise simulate", description=__doc__)
    p.add_argument("--trace", default="conv",
                   help="conv | code | mooncake | PATH to a CSV or JSONL like them | synthetic")
    p.add_argument("--start-s", type=float, default=0.0)
    p.add_argument("--duration-s", type=float, default=None, help="window of the trace (synthetic: its length)")
    p.add_argument("--time-scale", type=float, default=1.0, help="stretch the timeline by this factor")
    p.add_argument("--rate-scale", type=float, default=1.0, help="thin (<1) or replicate (>1) arrivals")
    p.add_argument("--rate", type=float, default=5.5, help="synthetic: requests/s")
    p.add_argument("--cv", type=float, default=1.0, help="synthetic: inter-arrival CV (1 = Poisson)")
    p.add_argument("--batch-fraction", type=float, default=0.0, help="share of batch service-class requests")
    p.add_argument("--multi-turn", action="store_true", help=(
        "the requests as turns of conversations sharing prefixes (sim.multi_turn: its assumptions), "
        "so replicas cache prefixes; for traces without prefix hashes (conv, code)"))
    p.add_argument("--router", default=SimConfig().replica_router,
                   choices=get_args(ReplicaRouter),
                   help="how a pool's request picks its replica (SimConfig.replica_router)")
    p.add_argument("--policy", action="append",
                   help=f"repeatable (default: singlepool and wattwise); e.g. {', '.join(SPECS)}")
    p.add_argument("--gpus", type=int, default=SimConfig().cluster_gpus, help="cluster size in GPUs")
    p.add_argument("--model", default="llama2-70b", choices=sorted(MODELS))
    p.add_argument("--hardware", default="h100-80gb", choices=sorted(GPUS))
    p.add_argument("--profile", default=None, choices=PROFILE_NAMES,
                   help="named perf/power profile (default: the current-stack profile covering --model "
                        "and --hardware, else Splitwise's fit)")
    p.add_argument("--cold-start", action="store_true", help="DynamoLLM Table V in full (new VM per replica)")
    p.add_argument("--control-interval-s", type=float, default=SimConfig().control_interval_s)
    p.add_argument("--price-per-gpu-hour", type=float, default=None)
    p.add_argument("--grid-gco2-per-kwh", type=float, default=SimConfig().grid_gco2_per_kwh)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-slo-guard", action="store_true", help=(
        "run the wattwise policy without its SLO guard (WattwiseConfig.slo_guard.enabled false)"))
    p.add_argument("--no-oracle", action="store_true", help=(
        "skip the oracle energy floor and the references beside it (a long run's 5 s windows take a while)"))
    p.add_argument("--json", type=Path, default=None, help="write one object per policy")
    p.add_argument("--plot-dir", type=Path, default=None, help="write PNG plots here")
    return p


def make_workload(args: argparse.Namespace, rng: np.random.Generator, max_context_tokens: int) -> Workload:
    if args.trace == "synthetic":
        lengths = load_trace("conv")
        w = synthetic(args.rate, args.duration_s or 3600.0, rng, cv=args.cv, lengths_from=lengths)
    else:
        if args.trace not in TRACES and not Path(args.trace).exists():
            raise SystemExit(f"no trace {args.trace!r}: use conv, code, mooncake, synthetic or a CSV or JSONL path")
        w = window(load_trace(args.trace), args.start_s, args.duration_s)
    if args.time_scale != 1.0:
        w = scale_time(w, args.time_scale)
    if args.rate_scale != 1.0:
        w = scale_rate(w, args.rate_scale, rng)
    if args.batch_fraction > 0:
        w = with_batch_fraction(w, args.batch_fraction, rng)
    w = fit_context(w, max_context_tokens)
    return multi_turn(w, rng) if args.multi_turn else w


def progress(policy: str) -> Callable[[float, float], None]:
    """A bar redrawn in place: for a terminal only (in a log or a pipe each of a run's
    thousands of redraws would stay as text)."""
    def report(now_s: float, end_s: float) -> None:
        share = min(now_s / end_s, 1.0) if end_s > 0 else 1.0
        bar = "#" * int(share * 30)
        print(f"\r{policy:>18} [{bar:<30}] {share:5.0%}", end="", file=sys.stderr, flush=True)
    return report


def _fmt(v: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if v is None else f"{v * scale:.{digits}g}"


def table(results: list[dict[str, Any]], floors: Floors | None) -> str:
    base = results[0]["energy_j"]
    head = f"{'policy':>18} {'energy kWh':>10} {'x first':>7} {'GPU-h':>7} {'SLO %':>6} {'worst class':>11} " \
           f"{'p99 TTFT s':>10} {'p99 TBT s':>9} {'done':>7} {'wall s':>6} {'setup s':>7}"
    lines = [head]
    for r in results:
        cls, worst = worst_class(r)
        lines.append(
            f"{r['policy']:>18} {r['energy_kwh']:>10.2f} {r['energy_j'] / base:>7.2f} {r['gpu_hours']:>7.1f} "
            f"{_fmt(r['slo_attainment']['overall'], 100):>6} "
            f"{cls + ' ' + format(worst * 100, '.1f'):>11} "
            f"{_fmt(r['p99_ttft_s']):>10} {_fmt(r['p99_tbt_s']):>9} {r['completed']:>7} {r['wall_s']:>6.1f} "
            f"{r['setup_s']:>7.1f}"
        )
    if floors is not None:
        for f in floors.rows():
            lines.append(f"{f.label:>18} {f.energy_j / J_PER_KWH:>10.2f} {f.energy_j / base:>7.2f} {f.gpu_hours:>7.1f}")
    for r in results:
        if r["slo_guard_s"]:
            lines.append(f"{r['policy']}: SLO guard on " + ", ".join(
                f"{cls} {s:.0f} s" for cls, s in sorted(r["slo_guard_s"].items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(format="%(message)s")
    for chooser in ("sim.best_static", "sim.scenario"):  # best-static's plan and search time, Serve's target
        logging.getLogger(chooser).setLevel(logging.INFO)
    config = SimConfig(
        model=args.model, hardware=args.hardware, profile=args.profile, cluster_gpus=args.gpus,
        overheads=OverheadTable.cold_cloud() if args.cold_start else OverheadTable(),
        control_interval_s=args.control_interval_s, price_per_gpu_hour=args.price_per_gpu_hour,
        grid_gco2_per_kwh=args.grid_gco2_per_kwh, replica_router=args.router,
    )
    rng = np.random.default_rng(args.seed)
    w = make_workload(args, rng, MODELS[args.model].max_context_tokens)
    if len(w) == 0:
        print("the workload is empty", file=sys.stderr)
        return 2
    print(f"{len(w)} requests over {w.duration_s:.0f} s ({len(w) / max(w.duration_s, 1e-9):.2f} req/s)",
          file=sys.stderr)
    results, runs = [], {}
    on_terminal = sys.stderr.isatty()
    # Default: the one controller, beside SinglePool as the reference ("x first").
    for policy in args.policy or ["singlepool", "wattwise"]:
        unguarded = args.no_slo_guard and policy == "wattwise"
        try:
            summary, raw = simulate(policy, w, config, on_progress=progress(policy) if on_terminal else None,
                                    wattwise_settings={"slo_guard": {"enabled": False}} if unguarded else None)
        except ValueError as exc:
            print(f"\n{policy}: {exc}", file=sys.stderr)
            return 2
        print("" if on_terminal else f"{policy}: simulated", file=sys.stderr)  # ends the bar's line
        if unguarded:
            summary["policy"] = "wattwise-noguard"
        results.append(summary)
        runs[policy] = raw
    floors = None if args.no_oracle else Floors.of(w, config)
    print(table(results, floors))
    if args.json is not None:
        payload = results if floors is None else [*results, *(
            {"policy": f.name, "energy_j": f.energy_j, "gpu_hours": f.gpu_hours} for f in floors.rows())]
        args.json.write_text(json.dumps(payload, indent=2))
    if args.plot_dir is not None:
        from sim.plots import plot_runs

        for path in plot_runs(runs, args.plot_dir):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
