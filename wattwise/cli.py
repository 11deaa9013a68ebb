"""`wattwise` command line: one entry point, a subcommand per job."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from core.paths import SERVE_CONFIG

if TYPE_CHECKING:
    from energy.latency_points import LatencyPoint
    from energy.perf_model import PerfModel

USAGE = """usage: wattwise COMMAND [ARGS]

commands:
  demo       start the app on simulated GPUs and replay the Azure conversation trace through it
  serve      run the app: `serve run` on serve_config.yaml (or --config PATH), behind HAProxy
  federate   one OpenAI endpoint over several wattwise apps (clouds): federate --config FILE
  simulate   replay a trace through the same policies in the discrete-event simulator
  calibrate  fit every perf/power profile and print its held-out error
  profile    sweep the modelled engine over TP x clock x load and write an energy profile (JSON)
  plan       Splitwise provisioning: prompt/token machines and types for a trace, SLOs and a goal
  prepare-model  build a local model for serve_config.cpu.yaml offline: prepare-model smollm2 [--out DIR]
  config-docs  print the configuration reference (docs/configuration.md) from the schema [--out PATH]
  gpu-check  check a GPU machine: NVML reads, clock lock and reset, a step sweep over clocks vs the profile
  bench      run a benchmark: bench NAME [ARGS] (`wattwise bench` alone lists every NAME)
"""


def _serve(argv: list[str]) -> int:
    """`serve run` with wattwise's ingress (HAProxy unless WATTWISE_INGRESS says otherwise).
    `serve run` runs in a session of its own and gets each Ctrl-C / SIGTERM once, from here,
    so that its clean shutdown is not interrupted; the HAProxy it started is ended after it
    (Ray 2.60 leaves it holding the port)."""
    import signal
    import subprocess

    import yaml

    from app.controller_layers import check_serve_file
    from wattwise.ingress_mode import DEFAULT_INGRESS
    from wattwise.local_serve import haproxy_pids, stop_haproxy

    config = str(SERVE_CONFIG)
    if argv[:1] == ["--config"] and len(argv) > 1:
        config, argv = argv[1], argv[2:]
    try:
        check_serve_file(yaml.safe_load(Path(config).read_text(encoding="utf-8")))
    except ValueError as e:
        print(f"{config}: {e}", file=sys.stderr)
        return 2
    serve_bin = os.path.join(os.path.dirname(sys.executable), "serve")
    running_before = haproxy_pids()
    child = subprocess.Popen([serve_bin, "run", config, *argv], env={**os.environ, **DEFAULT_INGRESS.env},
                             start_new_session=True)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    try:
        return child.wait()
    finally:
        stop_haproxy(lambda: haproxy_pids() - running_before)


def _calibrate(argv: list[str]) -> int:
    from energy.calibration import default_perf_model, holdout_report, power_cap_report
    from energy.mlenergy_calibration import holdouts
    from energy.profiles import MLENERGY_SOURCES, PROFILES, perf_model_for

    print("Profiles: the TPs each one fits (* = scaled by Splitwise's TP ratios, no held-out rows) and "
          "the model/GPU pairs it is the default for:")
    print(f"{'profile':<27} {'GPU':<11} {'TPs':<12} default for")
    for name, profile in PROFILES.items():
        source = MLENERGY_SOURCES.get(name)
        extrapolated = source.extrapolated_tps if source else ()
        tps = " ".join(f"{tp}{'*' if tp in extrapolated else ''}"
                       for tp in perf_model_for(name).tensor_parallel_degrees)
        default_for = [m for m in profile.models if default_perf_model(m, profile.hardware) is perf_model_for(name, m)]
        print(f"{name:<27} {profile.hardware:<11} {tps:<12} {', '.join(default_for) or '-'}")

    print("\nSplitwise profiles (energy/data/perf_model.csv), ~20% of configurations held out:")
    print(f"{'profile':<27} {'train':>6} {'test':>5} {'prompt MAPE':>12} {'token MAPE':>11}")
    for name, profile in PROFILES.items():
        if name not in MLENERGY_SOURCES:
            r = holdout_report(profile.models[0], profile.hardware)
            print(f"{name:<27} {r.train_rows:>6} {r.test_rows:>5} {r.prompt_mape_pct:>11.1f}% "
                  f"{r.token_mape_pct:>10.1f}%")
    prompt, token = power_cap_report()
    print(f"power-capped H100 (350 W/GPU) predicted from the uncapped fit: prompt MAPE {prompt:.1f}%, "
          f"token MAPE {token:.1f}%")

    results = holdouts(MLENERGY_SOURCES)
    print("\nML.ENERGY profiles (energy/data/mlenergy_llama3.csv), whole configurations held out:")
    print(f"{'profile':<27} {'held out':<18} {'train':>5} {'test':>4} {'ITL MAPE':>9} {'max':>6} "
          f"{'power MAPE':>11} {'J/tok MAPE':>11} {'max':>6}")
    for h in results:
        print(f"{h.profile:<27} {h.split:<18} {h.train_rows:>5} {len(h.predictions):>4} "
              f"{h.mape_pct('itl_ms'):>8.1f}% {h.max_error_pct('itl_ms'):>5.1f}% {h.mape_pct('power_w'):>10.1f}% "
              f"{h.mape_pct('j_per_token'):>10.1f}% {h.max_error_pct('j_per_token'):>5.1f}%")
    print(f"\n{'profile':<27} {'held out':<18} {'checkpoint':<24} {'seqs':>5} {'ITL ms':>7} {'pred':>6} "
          f"{'power W':>8} {'pred':>6} {'J/tok':>6} {'pred':>6}")
    for h in results:
        for p in h.predictions:
            row = p.row
            print(f"{h.profile:<27} {h.split:<18} {row.model_id.split('/')[-1]:<24} {row.max_num_seqs:>5} "
                  f"{row.itl_ms:>7.1f} {p.itl_ms:>6.1f} {row.power_w:>8.0f} {p.power_w:>6.0f} "
                  f"{row.j_per_token:>6.3f} {p.j_per_token:>6.3f}")
    return 0


def _profile(argv: list[str]) -> int:
    import argparse

    from batching.profile_sweep import sweep
    from energy.calibration import default_perf_model
    from energy.hardware import GPUS
    from energy.profile import CONV_CLASS_SHAPES, PROFILE_TPS, profile_clocks_mhz
    from energy.profile_builder import build_profile

    p = argparse.ArgumentParser(prog="wattwise profile", description="Write an energy profile for DynamoLLM.")
    p.add_argument("--out", required=True, help="JSON path; give it to the dynamollm policy as profile_path")
    p.add_argument("--model", default="llama2-70b")
    p.add_argument("--hardware", default="h100-80gb", choices=sorted(GPUS))
    p.add_argument("--source", choices=("engine", "model"), default="engine",
                   help="engine: measured sweeps of the modelled engine; model: the analytic steady state")
    p.add_argument("--classes", default=",".join(CONV_CLASS_SHAPES), help="comma-separated length classes")
    p.add_argument("--duration-s", type=float, default=120.0, help="virtual seconds per measured point")
    p.add_argument("--kind", choices=("energy", "ips"), default="energy",
                   help="energy: DynamoLLM's profile (JSON); ips: throttLL'eM's iterations/s samples (CSV)")
    p.add_argument("--vllm-model", help="profile a vLLM engine on this model dir instead: latency vs batch and "
                   "context (CSV); energy and clock where NVML exists")
    p.add_argument("--vllm-engine", default="{}", help="JSON of engine fields over the CPU defaults, e.g. "
                   '\'{"device": "gpu", "dtype": "auto", "distributed_executor_backend": null}\'')
    p.add_argument("--batches", default="1,4,16", help="vLLM: comma-separated batch sizes")
    p.add_argument("--contexts", default="64,256,768", help="vLLM: comma-separated prompt lengths (tokens)")
    p.add_argument("--output-tokens", type=int, default=32, help="vLLM: output tokens per request")
    p.add_argument("--step-tokens", type=int, help="vLLM: skip (batch, context) pairs whose prompts exceed one "
                   "engine step of this many tokens (max_num_batched_tokens): their TTFT and ITL span chunked, "
                   "mixed steps, and the fit leaves them out")
    p.add_argument("--profile-out", help="vLLM: also fit the measured latencies and write DynamoLLM's energy "
                   "profile (JSON) here")
    p.add_argument("--fit-latency", help="comma-separated CSVs of --vllm-model runs (one per TP): fit them and "
                   "write DynamoLLM's energy profile to --out; --model-dir names the model they measured")
    p.add_argument("--model-dir", help="--fit-latency: the served model's directory (its config.json)")
    args = p.parse_args(argv)
    if args.vllm_model:
        return _profile_ips_vllm(args) if args.kind == "ips" else _profile_vllm(args)
    if args.fit_latency:
        from energy.latency_points import load_latency_csv

        if not args.model_dir:
            p.error("--fit-latency needs --model-dir (the model the latencies were measured on)")
        points = [pt for path in args.fit_latency.split(",") for pt in load_latency_csv(path)]
        return _fit_profile(points, args.model_dir, args.hardware, args.out)
    perf = default_perf_model(args.model, args.hardware)
    if args.kind == "ips":
        return _profile_ips(perf, args.out)
    shapes = {c: CONV_CLASS_SHAPES[c] for c in args.classes.split(",")}
    model_profile = build_profile(perf, shapes=shapes)
    if args.source == "model":
        profile = model_profile
    else:
        # Measure at fractions of the load the analytic model says one instance carries.
        clocks = profile_clocks_mhz(perf.gpu)
        top = {c: max(model_profile.max_rate_per_s(c, tp, clock) for tp in PROFILE_TPS for clock in clocks)
               for c in shapes}
        rates = {c: tuple(round(top[c] * f, 4) for f in (0.1, 0.25, 0.5, 0.75, 1.0)) for c in shapes}
        total = len(shapes) * len(PROFILE_TPS) * len(clocks) * 5
        print(f"measuring {total} points ...", file=sys.stderr)
        profile = sweep(perf, shapes, PROFILE_TPS, clocks, rates, args.duration_s)
    profile.save(args.out)
    print(f"wrote {len(profile.points)} points to {args.out}")
    return 0


def _profile_vllm(args) -> int:
    """Latency vs batch and context measured on a vLLM engine (wattwise profile --vllm-model)."""
    import json

    from energy.latency_points import save_latency_csv
    from engines.latency_profiling import profile_engine
    from wattwise.tiny_model import tiny_engine_config

    config = tiny_engine_config(args.vllm_model, **json.loads(args.vllm_engine))
    points = profile_engine(config, tuple(int(b) for b in args.batches.split(",")),
                            tuple(int(c) for c in args.contexts.split(",")), args.output_tokens, args.step_tokens)
    save_latency_csv(points, args.out)
    print(f"{'batch':>6}{'context':>8}{'TTFT ms':>9}{'ITL ms':>8}{'tok/s':>8}{'energy J':>9}{'clock MHz':>10}")
    for pt in points:
        print(f"{pt.batch:>6}{pt.context_tokens:>8}{pt.ttft_s * 1000:>9.1f}{pt.itl_s * 1000:>8.2f}"
              f"{pt.tokens_per_s:>8.0f}{pt.energy_j:>9.1f}{pt.clock_mhz:>10.0f}")
    print(f"wrote {len(points)} points to {args.out}")
    if args.profile_out:
        return _fit_profile(points, args.vllm_model, json.loads(args.vllm_engine).get("hardware", args.hardware),
                            args.profile_out)
    return 0


def _fit_profile(points: list[LatencyPoint], model_dir: str, hardware: str, out: str) -> int:
    """Fit the perf model on a real engine's latencies and build DynamoLLM's profile from it."""
    from energy.engine_fit import fit_engine_perf_model, fit_quality
    from energy.hardware import GPUS, ModelSpec
    from energy.profile import CONV_CLASS_SHAPES
    from energy.profile_builder import build_profile

    model = ModelSpec.from_hf_config(model_dir)
    perf = fit_engine_perf_model(points, model, GPUS[hardware])
    for q in fit_quality(perf, points):
        print(f"fit TP{q.tp}: {q.points} points, in-sample MAPE prompt {q.prompt_mape_pct:.1f}% "
              f"token {q.token_mape_pct:.1f}%")
    shapes = {c: s for c, s in CONV_CLASS_SHAPES.items() if sum(s) <= model.max_context_tokens}
    profile = build_profile(perf, shapes=shapes, tps=tuple(perf.tensor_parallel_degrees))
    profile.save(out)
    print(f"wrote an energy profile of {model.name} on {hardware} ({len(profile.points)} points, classes "
          f"{','.join(profile.classes)}, TP {perf.tensor_parallel_degrees}) to {out}; give it to the dynamollm "
          "policy as profile_path")
    return 0


def _profile_ips(perf: PerfModel, out: str) -> int:
    """Sweep batch, KV fill and random clocks on the modelled engine; fit M and score it (Table III)."""
    import numpy as np

    from autoscaling.throttllem.ips_profiling import profile_ips
    from autoscaling.throttllem.ml_perf_model import split_scores

    samples = profile_ips(perf)
    np.savetxt(out, np.column_stack([samples.features(), samples.ips]), delimiter=",",
               header="tp,batch,kv_blocks,clock_mhz,ips", comments="")
    print(f"wrote {len(samples)} samples to {out}")
    for share in (0.9, 0.1):
        for name, sc in split_scores(samples, share).items():
            print(f"train {share:.0%}: {name:>6} R2 {sc.r2:.3f}  MAPE {sc.mape_pct:.1f}%  MAE {sc.mae_ips:.2f} it/s")
    return 0


def _profile_ips_vllm(args) -> int:
    """M's samples measured on a vLLM engine (wattwise profile --kind ips --vllm-model): scores
    held out by run and by row, beside the modelled engine's (by row, as `--kind ips` prints them)."""
    import json

    import numpy as np

    from autoscaling.throttllem.ml_perf_model import default_profile, group_fold_scores, split_scores
    from engines.ips_profiling_vllm import profile_ips_engine
    from wattwise.tiny_model import tiny_engine_config

    config = tiny_engine_config(args.vllm_model, **json.loads(args.vllm_engine))
    profile = profile_ips_engine(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    samples = profile.samples
    np.savetxt(args.out, np.column_stack([samples.features(), samples.ips, profile.runs]), delimiter=",",
               header="tp,batch,kv_blocks,clock_mhz,ips,run", comments="", fmt="%.6g")
    print(f"wrote {len(samples)} samples of {len(np.unique(profile.runs))} runs to {args.out}")
    print(f"batch {samples.batch.min():.0f}-{samples.batch.max():.0f}, KV blocks {samples.kv_blocks.min():.0f}-"
          f"{samples.kv_blocks.max():.0f}, clock {np.unique(samples.clock_mhz)} MHz, "
          f"{samples.ips.min():.1f}-{samples.ips.max():.1f} it/s")
    # By run: 10 folds of the runs, each held out once (90/10) or trained on alone (10/90), the
    # held-out predictions pooled; by row: one random row split, as the modelled engine's below.
    print(f"{'engine':<6} {'held out':<16} {'train':>5} {'model':>6} {'R2':>7} {'MAPE':>7} {'MAE it/s':>9}")
    sim = default_profile(args.model, args.hardware)
    for share in (0.9, 0.1):
        for engine, held_out, scores in (
                ("vllm", "by run, 10-fold", group_fold_scores(samples, profile.runs, share)),
                ("vllm", "by row", split_scores(samples, share)), ("sim", "by row", split_scores(sim, share))):
            for name, sc in scores.items():
                print(f"{engine:<6} {held_out:<16} {share:>5.0%} {name:>6} {sc.r2:>7.3f} {sc.mape_pct:>6.1f}% "
                      f"{sc.mae_ips:>9.2f}")
    return 0


def _benches() -> dict[str, EntryPoint]:
    """The benches, as they register themselves (pyproject's `wattwise.benches` entry points):
    the CLI sits below bench/ in the layer contract and imports none of it by name."""
    return {ep.name: ep for ep in entry_points(group="wattwise.benches")}


def _bench(argv: list[str]) -> int:
    benches = _benches()
    if not argv or argv[0] not in benches:
        print(f"usage: wattwise bench {'|'.join(sorted(benches))} [ARGS]", file=sys.stderr)
        return 2
    run: Callable[[list[str]], int] = benches[argv[0]].load()
    return run(argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    run: Callable[[list[str]], int]
    if command == "demo":
        from wattwise.demo import main as run
    elif command == "simulate":
        from sim.cli import main as run
    elif command == "serve":
        run = _serve
    elif command == "federate":
        from wattwise.federate import main as run
    elif command == "calibrate":
        run = _calibrate
    elif command == "profile":
        run = _profile
    elif command == "plan":
        from sim.plan_cli import main as run
    elif command == "prepare-model":
        from wattwise.prepare_model import main as run
    elif command == "bench":
        run = _bench
    elif command == "config-docs":
        from wattwise.config_docs import main as run
    elif command == "gpu-check":
        from wattwise.gpu_check import main as run
    else:
        print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
