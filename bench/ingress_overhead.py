"""Ingress overhead: the Serve path (HTTP -> ingress -> pool replica -> sim engine) against
the same sim engine called in-process, streaming and not, at concurrency 1 and 16, with
a bare Serve app (bench/bare_serve.py: FastAPI ingress -> handle -> the same engine)
deployed beside it as the baseline for what Ray Serve itself costs.

All three run identical requests on an identically configured engine, so the
differences in latency are what Serve and HTTP add (bare - direct) and what our layers
add on top (wattwise - bare). Prints a table.
Run: `wattwise bench ingress [--requests N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial

import numpy as np
import openai

from core.request import Request
from core.slo import SLO
from engines.sim_engine import SimEngine, SimEngineConfig
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
PROMPT_WORDS = 8
MAX_TOKENS = 8


async def _direct_call(engine: SimEngine, stream: bool) -> None:
    request = Request(uuid.uuid4().hex, PROMPT_WORDS, MAX_TOKENS, time.time(), SLO(ttft_s=1, tbt_s=1))
    async for _ in engine.generate(request):
        pass


async def _wait_ready(client: openai.AsyncOpenAI, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await _http_call(client, False)
        except openai.APIError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def _http_call(client: openai.AsyncOpenAI, stream: bool) -> None:
    prompt = " ".join(["word"] * PROMPT_WORDS)
    if stream:
        async for _ in await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True):
            pass
    else:
        await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)


async def _measure(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(range(requests))

    async def worker() -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start), latencies


async def _run(served: LocalServe, requests: int) -> list[tuple]:
    # Match the pool that serves short prompts in serve_config.yaml (TP2, max clock).
    engine = SimEngine(SimEngineConfig(tensor_parallel=2))
    client = openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key="local", max_retries=0, timeout=120)
    bare = openai.AsyncOpenAI(base_url=f"{served.base_url}/bare/v1", api_key="local", max_retries=0, timeout=120)
    await _http_call(client, False)  # warm the paths
    await _wait_ready(bare)
    rows = []
    for stream in (False, True):
        for concurrency in (1, 16):
            n = requests if concurrency == 1 else requests * 4
            d_rps, d_lat = await _measure(partial(_direct_call, engine, stream), n, concurrency)
            b_rps, b_lat = await _measure(partial(_http_call, bare, stream), n, concurrency)
            h_rps, h_lat = await _measure(partial(_http_call, client, stream), n, concurrency)
            rows.append((stream, concurrency, d_rps, b_rps, h_rps, d_lat, b_lat, h_lat))
    await engine.shutdown()
    return rows


def _with_bare_app(config: dict) -> None:
    config["applications"].append({"name": "bare", "route_prefix": "/bare", "import_path": "bench.bare_serve:build"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench ingress", description=__doc__)
    parser.add_argument("--requests", type=int, default=30, help="requests per cell at concurrency 1 (x4 at 16)")
    args = parser.parse_args(argv)
    with LocalServe(edit=_with_bare_app) as served:
        rows = asyncio.run(_run(served, args.requests))
    print(f"\nrequest: {PROMPT_WORDS} prompt tokens, {MAX_TOKENS} output tokens, "
          f"sim engine TP2 (~{MAX_TOKENS} x 37 ms)")
    print("p50 latency (ms) and throughput; added = over direct; ours = wattwise over bare Serve")
    print(f"{'mode':<8}{'conc':>5}{'direct':>8}{'bare':>8}{'wattwise':>10}{'bare added':>12}{'ours p50':>10}"
          f"{'ours p99':>10}{'bare rps':>10}{'ww rps':>8}{'ww/bare':>9}")
    for stream, conc, _d_rps, b_rps, h_rps, d_lat, b_lat, h_lat in rows:
        d50, b50, h50 = (np.percentile(lat, 50) * 1000 for lat in (d_lat, b_lat, h_lat))
        b99, h99 = (np.percentile(lat, 99) * 1000 for lat in (b_lat, h_lat))
        print(f"{'stream' if stream else 'unary':<8}{conc:>5}{d50:>8.1f}{b50:>8.1f}{h50:>10.1f}{b50 - d50:>12.1f}"
              f"{h50 - b50:>10.1f}{h99 - b99:>10.1f}{b_rps:>10.1f}{h_rps:>8.1f}{h_rps / b_rps:>9.2f}")
    return 0
