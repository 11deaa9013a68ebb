"""Ingress overhead: the Serve path (HTTP -> ingress -> pool replica -> modelled engine) against
the same modelled engine called in-process, streaming and not, at concurrency 1 and 16, with
a bare Serve app (bench/bare_serve.py: FastAPI ingress -> handle -> the same engine)
deployed beside it as the baseline for what Ray Serve itself costs.

All three run identical requests on an identically configured engine (wattwise's pools
held at their top clock by the utilisation policy, without throttLL'eM's per-step clock,
as the bare engine runs), so the differences in latency are what Serve and HTTP add
(bare - direct) and what our layers add on top (wattwise - bare). The `entry` column is
the part of wattwise's latency spent outside its ingress: HTTP, the load balancer and the
gateway (client latency minus the `e2e_s` the ingress reports). Each ingress mode
(wattwise/ingress_mode.py: Serve's proxy, direct ingress, HAProxy) gets its own Ray
cluster, since a mode is fixed when Ray starts, and is compared with the proxy measured
in the same run. Prints two tables.
Run: `wattwise bench ingress [--requests N] [--modes proxy,direct,haproxy]`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import openai

from core.request import Request
from core.slo import SLO
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig
from wattwise.ingress_mode import IngressMode
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"
PROMPT_WORDS = 8
MAX_TOKENS = 8
WORKLOADS = [(stream, concurrency) for stream in (False, True) for concurrency in (1, 16)]
Workload = tuple[bool, int]  # (streaming, concurrency)


@dataclass(frozen=True)
class Cell:
    """One path's latencies and throughput for one workload; for wattwise also the time
    outside its ingress (client latency minus the ingress's reported e2e_s)."""

    rps: float
    latencies_s: list[float]
    entry_s: list[float]

    def ms(self, percentile: float) -> float:
        return float(np.percentile(self.latencies_s, percentile) * 1000)

    def entry_ms(self, percentile: float) -> float:
        return float(np.percentile(self.entry_s, percentile) * 1000) if self.entry_s else float("nan")


Results = dict[Workload, dict[str, Cell]]  # by workload, then path: direct, bare, wattwise, no gateway


async def _direct_call(engine: ModelledEngine, stream: bool) -> float | None:
    request = Request(uuid.uuid4().hex, PROMPT_WORDS, MAX_TOKENS, time.time(), SLO(ttft_s=1, tbt_s=1))
    async for _ in engine.generate(request):
        pass
    return None


async def _wait_ready(client: openai.AsyncOpenAI, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _http_call(client, False)
            return
        except openai.APIError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def _http_call(client: openai.AsyncOpenAI, stream: bool) -> float | None:
    """One completion; the e2e_s its `wattwise` block reports (None from the bare app)."""
    prompt = " ".join(["word"] * PROMPT_WORDS)
    report: dict | None = None
    if stream:
        async for chunk in await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                                           stream=True):
            report = (chunk.model_extra or {}).get("wattwise") or report
    else:
        response = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)
        report = (response.model_extra or {}).get("wattwise")
    return report["e2e_s"] if report else None


async def _measure(call: Callable[[], Awaitable[float | None]], requests: int, concurrency: int) -> Cell:
    latencies: list[float] = []
    entry: list[float] = []
    queue = list(range(requests))

    async def worker() -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            reported_s = await call()
            latencies.append(time.perf_counter() - t0)
            if reported_s is not None:
                entry.append(latencies[-1] - reported_s)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Cell(requests / (time.perf_counter() - start), latencies, entry)


async def _run(urls: dict[str, str], requests: int) -> Results:
    """`urls`: each HTTP path's base URL (bare, wattwise, no gateway)."""
    # Match the pool that serves short prompts in serve_config.yaml (TP2, max clock).
    engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=2))
    clients = {name: openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0, timeout=120)
               for name, url in urls.items()}
    for client in clients.values():
        await _wait_ready(client)  # also warms the path
    paths: dict[str, Callable[[bool], Awaitable[float | None]]] = {
        "direct": partial(_direct_call, engine), **{name: partial(_http_call, c) for name, c in clients.items()}}
    results: Results = {}
    for stream, concurrency in WORKLOADS:
        n = requests if concurrency == 1 else requests * 4
        results[stream, concurrency] = {name: await _measure(partial(call, stream), n, concurrency)
                                        for name, call in paths.items()}
    await engine.shutdown()
    return results


def _with_baselines(config: dict) -> None:
    """Beside wattwise, the bare app and wattwise without its gateway (`gateway_replicas: 0`);
    both wattwise apps' engines run as the bare one does: at the top clock (the utilisation
    policy; no throttLL'eM per-step clock), and without the Batch API (one SQLite file each)."""
    app = config["applications"][0]
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation"}
    app["args"]["batch_api"] = {"enabled": False}
    for pool in app["args"]["pools"]:
        pool["engine"].pop("throttllem", None)
    without = copy.deepcopy(app)
    without.update({"name": "no-gateway", "route_prefix": "/no-gateway"})
    without["args"]["gateway_replicas"] = 0
    config["applications"] += [without, {"name": "bare", "route_prefix": "/bare",
                                         "import_path": "bench.bare_serve:build"}]


def _measure_mode(mode: IngressMode, requests: int) -> Results:
    with LocalServe(edit=_with_baselines, ingress=mode, num_cpus=4) as served:
        return asyncio.run(_run({"bare": served.url("/bare"), "wattwise": served.url("/"),
                                 "no gateway": served.url("/no-gateway")}, requests))


def _workload(stream: bool, concurrency: int) -> str:
    return f"{'stream' if stream else 'unary'} c{concurrency}"


def _print_overhead(by_mode: dict[IngressMode, Results]) -> None:
    print("\np50 latency (ms) and throughput; added = over direct; ours = wattwise over bare Serve; gateway = "
          "wattwise over wattwise without its gateway; entry = time outside the ingress (HTTP, load balancer, "
          "gateway) with / without the gateway")
    print(f"{'ingress':<9}{'workload':<11}{'direct':>8}{'bare':>8}{'wattwise':>10}{'bare added':>12}{'ours p50':>10}"
          f"{'ours p99':>10}{'gateway p50':>13}{'entry p50':>15}{'bare rps':>10}{'ww rps':>8}{'ww/bare':>9}"
          f"{'ww/no gw':>10}")
    for mode, results in by_mode.items():
        for (stream, conc), cells in results.items():
            d, b, w, n = cells["direct"], cells["bare"], cells["wattwise"], cells["no gateway"]
            entry = f"{w.entry_ms(50):.1f} / {n.entry_ms(50):.1f}"
            print(f"{mode:<9}{_workload(stream, conc):<11}{d.ms(50):>8.1f}{b.ms(50):>8.1f}{w.ms(50):>10.1f}"
                  f"{b.ms(50) - d.ms(50):>12.1f}{w.ms(50) - b.ms(50):>10.1f}{w.ms(99) - b.ms(99):>10.1f}"
                  f"{w.ms(50) - n.ms(50):>13.1f}{entry:>15}{b.rps:>10.1f}{w.rps:>8.1f}{w.rps / b.rps:>9.2f}"
                  f"{w.rps / n.rps:>10.2f}")


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
          f"modelled engine TP2 (~{MAX_TOKENS} x 37 ms)")
    _print_overhead(by_mode)
    _print_fast_path(by_mode)
    return 0
