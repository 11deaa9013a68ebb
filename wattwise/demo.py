"""The main job: serve the app on simulated GPUs and replay an Azure trace through it.

Real processes end to end: a local Ray cluster started with `serve run`, real HTTP on
loopback, the real `openai` client. Requests keep the trace's arrival times and token
counts (prompts are that many placeholder words, one token each; the modelled engine
generates exactly max_tokens). Prints a summary next to the simulator's figures for the
same window (the wattwise policy and SinglePool) and writes a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import openai

from core.efficiency import joules_per_generated_token, replica_energy_series
from energy.profiles import profile_label
from sim.config import SimConfig
from sim.metrics import summarise as summarise_run
from sim.scenario import as_the_app_starts, build, shipped_app, within_the_app_limits
from sim.simulator import Simulator
from sim.workload import fit_context, load_trace, window
from wattwise.local_serve import LocalServe
from wattwise.streamed_completion import extra_fields, stream_completion

MODEL = "llama2-70b-sim"
MAX_CONTEXT_TOKENS = 8192


@dataclass
class Outcome:
    arrival_s: float
    status: str  # "ok" or the error class
    streamed: bool
    report: dict | None = None
    energy_j: float = 0.0
    completion_tokens: int = 0
    client_ttft_s: float | None = None


async def _one(client: openai.AsyncOpenAI, start: float, arrival: float, prompt: int, out: int,
               stream: bool) -> Outcome:
    await asyncio.sleep(max(0.0, start + arrival - time.monotonic()))
    text = " ".join(["token"] * prompt)
    try:
        if not stream:
            resp = await client.completions.create(model=MODEL, prompt=text, max_tokens=out)
            usage = resp.usage
            assert usage is not None  # the server reports usage on every completion
            return Outcome(arrival, "ok", False, extra_fields(resp).get("wattwise"), extra_fields(usage)["energy_j"],
                           usage.completion_tokens)
        done = await stream_completion(client, MODEL, text, out)
        return Outcome(arrival, "ok", True, done.report, done.energy_j, done.completion_tokens, done.ttft_s)
    except openai.APIError as exc:
        return Outcome(arrival, type(exc).__name__, stream)


ENERGY_METRIC = "ray_wattwise_energy_joules"  # per replica, since its start, idle included
SAMPLE_S = 2.0
METRICS_LAG_S = 12.0
# The serving stack's share of the machine's cores above which the demo says its latency
# waited on the CPU.
BUSY_MACHINE_SHARE = 0.7


@dataclass
class FleetSample:
    """One look at the fleet: running replicas and GPUs per pool, each replica's energy."""

    t_s: float
    replicas: dict[str, int]
    gpus: int
    energy_j: dict[str, float]


def _look(served: LocalServe, t_s: float) -> FleetSample:
    status = served.pool_status()
    replicas = {pool: info["replicas"].get("RUNNING", 0) for pool, info in status.items()}
    # Starting replicas hold their GPUs too (the simulator counts them from the request).
    held = {pool: sum(info["replicas"].get(state, 0) for state in ("STARTING", "RUNNING", "UPDATING"))
            for pool, info in status.items()}
    gpus = sum(n * int(status[pool].get("tensor_parallel") or 1) for pool, n in held.items())
    return FleetSample(t_s, replicas, gpus, replica_energy_series(served.scrape(ENERGY_METRIC)))


async def _sample_fleet(served: LocalServe, start: float, samples: list[FleetSample], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            samples.append(await asyncio.to_thread(_look, served, time.monotonic() - start))
        except Exception as exc:  # keep sampling through a slow tick; the replay matters more
            print(f"fleet sample failed: {exc}", file=sys.stderr)
        await asyncio.sleep(SAMPLE_S)


@dataclass(frozen=True)
class StackCpu:
    """CPU the serving stack's processes used over the replay, by process name: on a machine
    it saturates, the live app's latency includes waiting for a core, which the simulator's
    replicas never do."""

    wall_s: float
    cores: int
    by_process_s: dict[str, float]

    @classmethod
    def between(cls, before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                wall_s: float) -> StackCpu:
        """From two `LocalServe.cpu_s` readings: per pid, a process started since counts from 0."""
        used: dict[str, float] = defaultdict(float)
        for pid, (name, cpu_s) in after.items():
            used[name] += cpu_s - (before[pid][1] if pid in before else 0.0)
        return cls(wall_s, os.cpu_count() or 1, dict(used))

    @property
    def total_s(self) -> float:
        return sum(self.by_process_s.values())

    @property
    def machine_share(self) -> float:
        return self.total_s / (self.wall_s * self.cores)


def fleet_energy_j(samples: list[FleetSample]) -> float:
    """Energy the fleet drew over the samples: per replica, its last reading minus its
    first (replicas started later count from zero, those stopped keep their last)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for i, sample in enumerate(samples):
        for series, value in sample.energy_j.items():
            first.setdefault(series, value if i == 0 else 0.0)
            last[series] = value
    return sum(last[k] - first[k] for k in last)


def gpu_hours(samples: list[FleetSample]) -> float:
    return sum(a.gpus * (b.t_s - a.t_s) for a, b in pairwise(samples)) / 3600.0


async def replay(served: LocalServe, trace: str, start_s: float, duration_s: float, stream_fraction: float,
                 seed: int) -> tuple[list[Outcome], list[FleetSample]]:
    w = fit_context(window(load_trace(trace), start_s, duration_s), MAX_CONTEXT_TOKENS)
    rng = np.random.default_rng(seed)
    streamed = rng.random(len(w)) < stream_fraction
    client = openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key="local", max_retries=0, timeout=600)
    samples: list[FleetSample] = []
    stop = asyncio.Event()
    start = time.monotonic()
    sampler = asyncio.create_task(_sample_fleet(served, start, samples, stop))
    print(f"replaying {len(w)} requests of the {trace} trace over {duration_s:.0f} s ...", file=sys.stderr)
    outcomes = await asyncio.gather(*(
        _one(client, start, float(a), int(p), int(o), bool(s))
        for a, p, o, s in zip(w.arrival_s, w.prompt_tokens, w.output_tokens, streamed, strict=True)
    ))
    # Ray refreshes its metrics endpoint every ~10 s: the last energy reading must see the end.
    await asyncio.sleep(METRICS_LAG_S)
    stop.set()
    await sampler
    return list(outcomes), samples


def summarise(outcomes: list[Outcome], samples: list[FleetSample], cpu: StackCpu) -> dict:
    ok = [o for o in outcomes if o.status == "ok" and o.report]
    reports = [o.report for o in ok if o.report]
    errors: dict[str, int] = defaultdict(int)
    for o in outcomes:
        if o.status != "ok":
            errors[o.status] += 1
    per_class: dict[str, list[bool]] = defaultdict(list)
    for report in reports:
        per_class[report["length_class"]].append(report["slo_met"])
    tokens = sum(o.completion_tokens for o in ok)
    fleet_j = fleet_energy_j(samples)
    peak: dict[str, int] = defaultdict(int)
    for sample in samples:
        for pool, n in sample.replicas.items():
            peak[pool] = max(peak[pool], n)
    return {
        "requests": len(outcomes),
        "completed": len(ok),
        "errors": dict(errors),
        "slo_attainment": sum(r["slo_met"] for r in reports) / max(len(ok), 1),
        "slo_attainment_per_class": {c: sum(v) / len(v) for c, v in sorted(per_class.items())},
        "p99_ttft_s": float(np.percentile([r["ttft_s"] for r in reports], 99)) if ok else None,
        "p99_mean_tbt_s": float(np.percentile([r["mean_tbt_s"] for r in reports], 99)) if ok else None,
        "j_per_token": joules_per_generated_token(fleet_j, tokens),
        "attributed_j_per_token": sum(o.energy_j for o in ok) / max(tokens, 1),
        "energy_j": fleet_j,
        "gpu_hours": gpu_hours(samples),
        "peak_replicas_per_pool": dict(peak),
        "final_replicas_per_pool": samples[-1].replicas if samples else {},
        "serving_cpu_s": cpu.total_s,
        "serving_cpu_machine_share": cpu.machine_share,
        "serving_cpu_s_by_process": dict(sorted(cpu.by_process_s.items(), key=lambda kv: -kv[1])),
    }


def simulated(trace: str, start_s: float, duration_s: float) -> dict[str, dict]:
    """The simulator on the same window: the wattwise policy as the app ran it (started as
    serve_config.yaml starts it, not at the planner's opening shape the comparisons use), and
    SinglePool provisioned for the window's peak (its definition)."""
    w = fit_context(window(load_trace(trace), start_s, duration_s), MAX_CONTEXT_TOKENS)
    config = SimConfig()
    app = shipped_app()
    out = {}
    for policy in ("wattwise", "singlepool"):
        setups, controller = build(policy, w, config)
        if policy == "wattwise":
            setups = within_the_app_limits(as_the_app_starts(setups, app), app)
        summary = summarise_run(Simulator(w, controller, setups, config).run(), config)
        out[policy] = {"j_per_token": summary["j_per_token"], "slo_attainment": summary["slo_attainment"]["overall"],
                       "gpu_hours": summary["gpu_hours"], "energy_j": summary["energy_j"]}
    return out


def plot(outcomes: list[Outcome], samples: list[FleetSample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.plots import log_seconds_axis

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_pool: dict[str, list[float]] = defaultdict(list)
    for o in outcomes:
        if o.report:
            by_pool[o.report["pool"]].append(o.report["ttft_s"])
    for pool, ttfts in sorted(by_pool.items()):
        xs = np.sort(ttfts)
        ax1.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{pool} (n={len(xs)})")
    ax1.set(xscale="log", xlabel="TTFT (s)", ylabel="CDF", title="Time to first token per pool")
    log_seconds_axis(ax1.xaxis)
    ax1.legend()
    pools = sorted({p for sample in samples for p in sample.replicas})
    for pool in pools:
        ax2.step([x.t_s for x in samples], [x.replicas.get(pool, 0) for x in samples], where="post", label=pool)
    ax2.set(xlabel="time (s)", ylabel="running replicas", title="Replicas per pool (wattwise controller)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(summary: dict, sim: dict[str, dict]) -> None:
    config = SimConfig()
    profile = profile_label(config.profile, config.model, config.hardware)
    print(f"\n== wattwise demo: simulated {config.hardware}, {config.model} on perf profile {profile}, "
          "the wattwise controller ==")
    print(f"requests {summary['requests']}  completed {summary['completed']}  errors {summary['errors'] or 'none'}")
    print(f"p99 TTFT {summary['p99_ttft_s']:.3f} s   p99 mean TBT {summary['p99_mean_tbt_s']:.3f} s")
    print("SLO attainment per length class: "
          + "  ".join(f"{c} {v:.0%}" for c, v in summary["slo_attainment_per_class"].items()))
    print("replicas per pool (peak / final): "
          + "  ".join(f"{p} {n}/{summary['final_replicas_per_pool'].get(p, 0)}"
                      for p, n in sorted(summary["peak_replicas_per_pool"].items())))
    print("\nJ/token = fleet GPU energy (idle included) / generated tokens (core/efficiency.py)")
    print(f"{'':>22} {'J/token':>8} {'SLO met':>8} {'GPU-h':>7}")
    print(f"{'live app (wattwise)':>22} {summary['j_per_token']:>8.2f} {summary['slo_attainment']:>8.1%} "
          f"{summary['gpu_hours']:>7.3f}")
    for policy, row in sim.items():
        print(f"{'simulator, ' + policy:>22} {row['j_per_token']:>8.2f} {row['slo_attainment']:>8.1%} "
              f"{row['gpu_hours']:>7.3f}")
    ours, base = sim["wattwise"], sim["singlepool"]
    print(f"saving vs SinglePool (simulator): {1 - ours['energy_j'] / base['energy_j']:.0%} energy, "
          f"{1 - ours['gpu_hours'] / base['gpu_hours']:.0%} GPU-hours; live / simulated J/token "
          f"{summary['j_per_token'] / ours['j_per_token']:.2f}")
    print(f"(attributed to requests, idle excluded: {summary['attributed_j_per_token']:.2f} J/token)")
    heaviest = list(summary["serving_cpu_s_by_process"].items())[:4]
    top = ", ".join(f"{name.rpartition(':')[2]} {s:.0f} s" for name, s in heaviest)
    print(f"serving stack's CPU over the replay: {summary['serving_cpu_s']:.0f} s, "
          f"{summary['serving_cpu_machine_share']:.0%} of this machine ({top})")
    if summary["serving_cpu_machine_share"] > BUSY_MACHINE_SHARE:
        print("  a busy CPU delays the live app's tokens (its SLO column); the simulator's replicas never wait for one")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise demo", description=__doc__)
    parser.add_argument("--trace", default="conv", help="conv, code, or a CSV path with the same columns")
    parser.add_argument("--start-s", type=float, default=0.0)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--stream-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--dashboard", action="store_true",
                        help="run Ray's dashboard beside the replay (off by default: on a small machine its CPU is "
                             "the live app's)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("starting a local Ray cluster and the app from serve_config.yaml ...", file=sys.stderr)
    with LocalServe(log=args.out / "serve.log", dashboard=args.dashboard) as served:
        if args.dashboard:
            print(f"Ray's dashboard: http://127.0.0.1:{served.dashboard_port}", file=sys.stderr)
        cpu_before, started = served.cpu_s(), time.monotonic()
        outcomes, samples = asyncio.run(
            replay(served, args.trace, args.start_s, args.duration_s, args.stream_fraction, args.seed)
        )
        cpu = StackCpu.between(cpu_before, served.cpu_s(), time.monotonic() - started)
    summary = summarise(outcomes, samples, cpu)
    print("simulating the same window (wattwise and SinglePool) ...", file=sys.stderr)
    sim = simulated(args.trace, args.start_s, args.duration_s)
    print_summary(summary, sim)
    (args.out / "summary.json").write_text(json.dumps({**summary, "simulator": sim}, indent=2))
    plot(outcomes, samples, args.out / "demo.png")
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'demo.png'}")
    return 0 if summary["completed"] == summary["requests"] else 1
