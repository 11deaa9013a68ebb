"""Ingress overhead: the Serve path (HTTP -> ingress -> pool replica -> sim engine) against
the same sim engine called in-process, streaming and not, at concurrency 1 and 16, with
a bare Serve app (bench/bare_serve.py: FastAPI ingress -> handle -> the same engine)
deployed beside it as the baseline for what Ray Serve itself costs.

All three run identical requests on an identically configured engine, so the
differences in latency are what Serve and HTTP add (bare - direct) and what our layers
add on top (wattwise - bare). Each ingress mode (wattwise/ingress_mode.py: Serve's proxy,
direct ingress, HAProxy) gets its own Ray cluster, since a mode is fixed when Ray starts,
and is compared with the proxy measured in the same run. Prints two tables.
Run: `wattwise bench ingress [--requests N] [--modes proxy,direct,haproxy]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import openai

from core.request import Request
from core.slo import SLO
from engines.sim_engine import SimEngine, SimEngineConfig
from wattwise.ingress_mode import IngressMode
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
PROMPT_WORDS = 8
MAX_TOKENS = 8
WORKLOADS = [(stream, concurrency) for stream in (False, True) for concurrency in (1, 16)]
Workload = tuple[bool, int]  # (streaming, concurrency)


@dataclass(frozen=True)
class Cell:
    """One path's latencies and throughput for one workload."""

    rps: float
    latencies_s: list[float]

    def ms(self, percentile: float) -> float:
        return float(np.percentile(self.latencies_s, percentile) * 1000)


Results = dict[Workload, dict[str, Cell]]  # by workload, then path: direct, bare, wattwise


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


async def _measure(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> Cell:
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
    return Cell(requests / (time.perf_counter() - start), latencies)


async def _run(wattwise_url: str, bare_url: str, requests: int) -> Results:
    # Match the pool that serves short prompts in serve_config.yaml (TP2, max clock).
    engine = SimEngine(SimEngineConfig(tensor_parallel=2))
    bare, ours = (openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0, timeout=120)
                  for url in (bare_url, wattwise_url))
    for client in (bare, ours):
        await _wait_ready(client)  # also warms the path
    paths: dict[str, Callable[[bool], Awaitable[None]]] = {
        "direct": partial(_direct_call, engine), "bare": partial(_http_call, bare),
        "wattwise": partial(_http_call, ours)}
    results: Results = {}
    for stream, concurrency in WORKLOADS:
        n = requests if concurrency == 1 else requests * 4
        results[stream, concurrency] = {name: await _measure(partial(call, stream), n, concurrency)
                                        for name, call in paths.items()}
    await engine.shutdown()
    return results


def _with_bare_app(config: dict) -> None:
    config["applications"].append({"name": "bare", "route_prefix": "/bare", "import_path": "bench.bare_serve:build"})


def _measure_mode(mode: IngressMode, requests: int) -> Results:
    with LocalServe(edit=_with_bare_app, ingress=mode) as served:
        return asyncio.run(_run(served.url("/"), served.url("/bare"), requests))


def _workload(stream: bool, concurrency: int) -> str:
    return f"{'stream' if stream else 'unary'} c{concurrency}"


def _print_overhead(by_mode: dict[IngressMode, Results]) -> None:
    print("\np50 latency (ms) and throughput; added = over direct; ours = wattwise over bare Serve")
    print(f"{'ingress':<9}{'workload':<11}{'direct':>8}{'bare':>8}{'wattwise':>10}{'bare added':>12}{'ours p50':>10}"
          f"{'ours p99':>10}{'bare rps':>10}{'ww rps':>8}{'ww/bare':>9}")
    for mode, results in by_mode.items():
        for (stream, conc), cells in results.items():
            d, b, w = cells["direct"], cells["bare"], cells["wattwise"]
            print(f"{mode:<9}{_workload(stream, conc):<11}{d.ms(50):>8.1f}{b.ms(50):>8.1f}{w.ms(50):>10.1f}"
                  f"{b.ms(50) - d.ms(50):>12.1f}{w.ms(50) - b.ms(50):>10.1f}{w.ms(99) - b.ms(99):>10.1f}"
                  f"{b.rps:>10.1f}{w.rps:>8.1f}{w.rps / b.rps:>9.2f}")


def _print_fast_path(by_mode: dict[IngressMode, Results]) -> None:
    """Each mode's wattwise and bare latency as a ratio of the proxy's in this run (< 1 is faster)."""
    baseline = by_mode[IngressMode.PROXY]
    print("\nlatency (ms) by ingress mode; x proxy = this mode's over the proxy's in this run")
    columns = "".join(f"{name:>12}" for name in ("p50", "p99", "p50 x proxy", "p99 x proxy"))
    print(f"{'':<20}{'wattwise':^48}{'bare Serve':^48}")
    print(f"{'workload':<11}{'ingress':<9}{columns}{columns}")
    for workload in WORKLOADS:
        for mode, results in by_mode.items():
            row = ""
            for path in ("wattwise", "bare"):
                cell, ref = results[workload][path], baseline[workload][path]
                row += f"{cell.ms(50):>12.1f}{cell.ms(99):>12.1f}"
                row += f"{cell.ms(50) / ref.ms(50):>12.2f}{cell.ms(99) / ref.ms(99):>12.2f}"
            print(f"{_workload(*workload):<11}{mode:<9}{row}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench ingress", description=__doc__)
    parser.add_argument("--requests", type=int, default=30, help="requests per cell at concurrency 1 (x4 at 16)")
    parser.add_argument("--modes", type=lambda s: [IngressMode(m) for m in s.split(",")], default=list(IngressMode),
                        help="ingress modes, comma-separated (proxy is always measured: the others are compared to it)")
    args = parser.parse_args(argv)
    modes = [IngressMode.PROXY, *(m for m in args.modes if m is not IngressMode.PROXY)]
    by_mode = {mode: _measure_mode(mode, args.requests) for mode in modes}
    print(f"\nrequest: {PROMPT_WORDS} prompt tokens, {MAX_TOKENS} output tokens, "
          f"sim engine TP2 (~{MAX_TOKENS} x 37 ms)")
    _print_overhead(by_mode)
    _print_fast_path(by_mode)
    return 0
