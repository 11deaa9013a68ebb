"""The main job: serve the app on simulated GPUs and replay an Azure trace through it.

Real processes end to end: a local Ray cluster started with `serve run`, real HTTP on
loopback, the real `openai` client. Requests keep the trace's arrival times and token
counts (prompts are that many words; the sim engine counts one token per word and
generates exactly max_tokens). Prints a summary and writes a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai

from sim.workload import fit_context, load_trace, window
from wattwise.local_serve import LocalServe

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


async def _one(client: openai.AsyncOpenAI, start: float, arrival: float, prompt: int, out: int, stream: bool) -> Outcome:
    await asyncio.sleep(max(0.0, start + arrival - time.monotonic()))
    sent = time.monotonic()
    text = " ".join(["token"] * prompt)
    try:
        if not stream:
            resp = await client.completions.create(model=MODEL, prompt=text, max_tokens=out)
            return Outcome(arrival, "ok", False, resp.model_extra.get("wattwise"), resp.usage.model_extra["energy_j"],
                           resp.usage.completion_tokens)
        result = Outcome(arrival, "ok", True)
        chunks = await client.completions.create(
            model=MODEL, prompt=text, max_tokens=out, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].text and result.client_ttft_s is None:
                result.client_ttft_s = time.monotonic() - sent
            if chunk.model_extra.get("wattwise"):
                result.report = chunk.model_extra["wattwise"]
            if chunk.usage:
                result.energy_j = chunk.usage.model_extra["energy_j"]
                result.completion_tokens = chunk.usage.completion_tokens
        return result
    except openai.APIError as exc:
        return Outcome(arrival, type(exc).__name__, stream)


async def _sample_replicas(served: LocalServe, start: float, samples: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            counts = await asyncio.to_thread(served.pool_replicas)
            samples.append((time.monotonic() - start, counts))
        except Exception as exc:  # keep sampling through a slow tick; the replay matters more
            print(f"replica sample failed: {exc}", file=sys.stderr)
        await asyncio.sleep(2)


async def replay(served: LocalServe, trace: str, start_s: float, duration_s: float, stream_fraction: float,
                 seed: int) -> tuple[list[Outcome], list]:
    w = fit_context(window(load_trace(trace), start_s, duration_s), MAX_CONTEXT_TOKENS)
    rng = np.random.default_rng(seed)
    streamed = rng.random(len(w)) < stream_fraction
    client = openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key="local", max_retries=0, timeout=600)
    samples: list = []
    stop = asyncio.Event()
    start = time.monotonic()
    sampler = asyncio.create_task(_sample_replicas(served, start, samples, stop))
    print(f"replaying {len(w)} requests of the {trace} trace over {duration_s:.0f} s ...", file=sys.stderr)
    outcomes = await asyncio.gather(*(
        _one(client, start, float(a), int(p), int(o), bool(s))
        for a, p, o, s in zip(w.arrival_s, w.prompt_tokens, w.output_tokens, streamed, strict=True)
    ))
    stop.set()
    await sampler
    return list(outcomes), samples


def summarise(outcomes: list[Outcome], samples: list) -> dict:
    ok = [o for o in outcomes if o.status == "ok" and o.report]
    errors: dict[str, int] = defaultdict(int)
    for o in outcomes:
        if o.status != "ok":
            errors[o.status] += 1
    per_class: dict[str, list[bool]] = defaultdict(list)
    for o in ok:
        per_class[o.report["length_class"]].append(o.report["slo_met"])
    tokens = sum(o.completion_tokens for o in ok)
    energy = sum(o.energy_j for o in ok)
    peak: dict[str, int] = defaultdict(int)
    for _, counts in samples:
        for pool, n in counts.items():
            peak[pool] = max(peak[pool], n)
    return {
        "requests": len(outcomes),
        "completed": len(ok),
        "errors": dict(errors),
        "slo_attainment": sum(o.report["slo_met"] for o in ok) / max(len(ok), 1),
        "slo_attainment_per_class": {c: sum(v) / len(v) for c, v in sorted(per_class.items())},
        "p99_ttft_s": float(np.percentile([o.report["ttft_s"] for o in ok], 99)) if ok else None,
        "p99_mean_tbt_s": float(np.percentile([o.report["mean_tbt_s"] for o in ok], 99)) if ok else None,
        "joules_per_token": energy / max(tokens, 1),
        "energy_j": energy,
        "peak_replicas_per_pool": dict(peak),
        "final_replicas_per_pool": samples[-1][1] if samples else {},
    }


def plot(outcomes: list[Outcome], samples: list, path: Path) -> None:
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
    pools = sorted({p for _, c in samples for p in c})
    for pool in pools:
        ax2.step([t for t, _ in samples], [c.get(pool, 0) for _, c in samples], where="post", label=pool)
    ax2.set(xlabel="time (s)", ylabel="running replicas", title="Replicas per pool (wattwise controller)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(summary: dict) -> None:
    print("\n== wattwise demo: simulated H100s, Llama2-70B profile ==")
    print(f"requests {summary['requests']}  completed {summary['completed']}  errors {summary['errors'] or 'none'}")
    print(f"SLO attainment {summary['slo_attainment']:.1%}   J/token {summary['joules_per_token']:.2f}   "
          f"energy {summary['energy_j'] / 3.6e6:.4f} kWh")
    print(f"p99 TTFT {summary['p99_ttft_s']:.3f} s   p99 mean TBT {summary['p99_mean_tbt_s']:.3f} s")
    print("SLO attainment per length class: "
          + "  ".join(f"{c} {v:.0%}" for c, v in summary["slo_attainment_per_class"].items()))
    print("replicas per pool (peak / final): "
          + "  ".join(f"{p} {n}/{summary['final_replicas_per_pool'].get(p, 0)}"
                      for p, n in sorted(summary["peak_replicas_per_pool"].items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise demo", description=__doc__)
    parser.add_argument("--trace", default="conv", help="conv, code, or a CSV path with the same columns")
    parser.add_argument("--start-s", type=float, default=0.0)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--stream-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("starting a local Ray cluster and the app from serve_config.yaml ...", file=sys.stderr)
    with LocalServe(log=args.out / "serve.log") as served:
        outcomes, samples = asyncio.run(
            replay(served, args.trace, args.start_s, args.duration_s, args.stream_fraction, args.seed)
        )
    summary = summarise(outcomes, samples)
    print_summary(summary)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(outcomes, samples, args.out / "demo.png")
    print(f"wrote {args.out / 'summary.json'} and {args.out / 'demo.png'}")
    return 0 if summary["completed"] == summary["requests"] else 1
