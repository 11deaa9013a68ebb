"""Measure a profile by sweeping an engine (DynamoLLM §IV-A, "generating LLM profiles").

Each (class, TP, clock, load) point runs Poisson arrivals of the class's request shape
through one replica's ContinuousBatcher in virtual time and records mean power, the
p90 TTFT and the p90 of per-request mean TBT. It is the `sim` engine's measurement:
the same loop a GPU sweep would run, with the modelled GPU in place of a real one.
"""

from __future__ import annotations

import asyncio
import csv
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from energy.perf_model import PerfModel
from energy.profile import EnergyProfile, ProfilePoint
from engines.batching import BatcherConfig, ContinuousBatcher
from engines.protocol import Engine

_ANY_SLO = SLO(ttft_s=3600, tbt_s=60)


def measure_point(
    perf: PerfModel, shape: tuple[int, int], tp: int, clock_mhz: int, rate_per_s: float,
    duration_s: float = 120.0, seed: int = 0,
) -> tuple[float, float, float]:
    """(mean power W, p90 TTFT s, p90 mean TBT s) of one replica under Poisson load."""
    rng = np.random.default_rng(seed)
    n = max(int(rate_per_s * duration_s), 1)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    prompt, output = shape
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=tp, clock_mhz=clock_mhz))
    ttft, tbt = [], []
    t, i = 0.0, 0
    batcher.stats(0.0)
    while i < n or batcher.has_work():
        while i < n and arrivals[i] <= t:
            batcher.add(Request(str(i), prompt, output, float(arrivals[i]), _ANY_SLO), float(arrivals[i]))
            i += 1
        step = batcher.plan_step(t)
        if step is None:
            t = float(arrivals[i])
            continue
        out = batcher.finish_step(step)
        t = out.end_s
        for seq in out.finished:
            ttft.append(seq.first_token_s - seq.request.arrival_s)
            tbt.append((seq.last_token_s - seq.first_token_s) / max(seq.generated - 1, 1))
    power = batcher.stats(t).energy_j / t
    return power, float(np.percentile(ttft, 90)), float(np.percentile(tbt, 90))


def sweep(
    perf: PerfModel, shapes: dict[str, tuple[int, int]], tps: tuple[int, ...], clocks_mhz: tuple[int, ...],
    rates_per_s: dict[str, tuple[float, ...]], duration_s: float = 120.0,
) -> EnergyProfile:
    """Measure every (class, TP, clock, rate) point and assemble the profile."""
    points = [
        ProfilePoint(cls, tp, clock, rate, *measure_point(perf, shape, tp, clock, rate, duration_s))
        for cls, shape in shapes.items()
        for tp in tps if tp in perf.fits
        for clock in clocks_mhz
        for rate in rates_per_s[cls]
    ]
    return EnergyProfile(perf.model.name, perf.gpu.name, points)


# ---- a real engine (vLLM): latency vs batch size and context ---------------------------
# The same questions the perf model answers for the sim engine (prompt time grows with
# context, token time with batch), measured on a running engine: the data to fit or check
# a model of a real replica. Energy and clock come from NVML where the engine has GPUs
# (0 on a CPU backend: reported, not invented).


@dataclass(frozen=True)
class LatencyPoint:
    batch: int
    context_tokens: int
    output_tokens: int  # asked of each request (greedy; a request may stop early at EOS)
    tensor_parallel: int
    ttft_s: float  # mean over the batch (all requests arrive together)
    itl_s: float  # mean time per output token after the first
    tokens_per_s: float  # output tokens of the batch / its wall time
    energy_j: float
    clock_mhz: float


def prompt_of_tokens(engine: Engine, tokens: int, salt: str = "") -> str:
    """`salt` + the longest prefix of a fixed text that the engine counts as at most
    `tokens` tokens in all. A unique salt defeats prefix caching, which would otherwise
    turn every repeated prompt into a cache hit and hide the prefill being measured."""
    words = ("Return the number of items in the list and the size of each item " * tokens).split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if engine.count_tokens(salt + " ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return salt + " ".join(words[:lo])


async def measure_latency(engine: Engine, batches: tuple[int, ...], contexts: tuple[int, ...],
                          output_tokens: int) -> list[LatencyPoint]:
    """Send `batch` greedy requests of `context` prompt tokens at once, per (batch, context),
    after one unmeasured request (the first one pays the engine's warm-up)."""
    await _usage(engine, prompt_of_tokens(engine, min(contexts), "warm-up: "), output_tokens)
    points = []
    for context in contexts:
        for batch in batches:
            prompts = [prompt_of_tokens(engine, context, f"{uuid.uuid4().hex[:8]}: ") for _ in range(batch)]
            before = engine.stats()
            start = time.perf_counter()
            usages = await asyncio.gather(*(_usage(engine, prompt, output_tokens) for prompt in prompts))
            wall_s = time.perf_counter() - start
            after = engine.stats()
            itls = [(u.e2e_s - u.ttft_s) / (u.completion_tokens - 1) for u in usages if u.completion_tokens > 1]
            points.append(LatencyPoint(
                batch=batch, context_tokens=round(float(np.mean([u.prompt_tokens for u in usages]))),
                output_tokens=output_tokens, tensor_parallel=after.tensor_parallel,
                ttft_s=float(np.mean([u.ttft_s for u in usages])), itl_s=float(np.mean(itls)) if itls else 0.0,
                tokens_per_s=sum(u.completion_tokens for u in usages) / wall_s,
                energy_j=after.energy_j - before.energy_j, clock_mhz=after.clock_mhz,
            ))
    return points


async def _usage(engine: Engine, prompt: str, output_tokens: int):
    request = Request(f"profile-{uuid.uuid4().hex}", engine.count_tokens(prompt), output_tokens, time.time(),
                      _ANY_SLO, prompt_text=prompt, sampling=Sampling(temperature=0.0))
    async for chunk in engine.generate(request):
        if chunk.usage is not None:
            return chunk.usage
    raise RuntimeError(f"engine ended {request.request_id} without usage")


def profile_engine(engine_config: dict, batches: tuple[int, ...], contexts: tuple[int, ...],
                   output_tokens: int) -> list[LatencyPoint]:
    """Start the engine a pool config names (e.g. vLLM), measure it, shut it down."""
    from engines.factory import make_engine

    async def run() -> list[LatencyPoint]:
        engine = make_engine(engine_config)
        try:
            return await measure_latency(engine, batches, contexts, output_tokens)
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def save_latency_csv(points: list[LatencyPoint], out: str | Path) -> None:
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(LatencyPoint)])
        writer.writeheader()
        writer.writerows(asdict(p) for p in points)


def load_latency_csv(path: str | Path) -> list[LatencyPoint]:
    """Read what save_latency_csv wrote; a missing column names the file and the column."""
    kinds = {f.name: (int if f.type == "int" else float) for f in fields(LatencyPoint)}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = set(kinds) - set(rows[0] if rows else kinds)
    if missing:
        raise ValueError(f"{path}: not a `wattwise profile --vllm-model` CSV, missing columns {sorted(missing)}")
    return [LatencyPoint(**{k: kinds[k](r[k]) for k in kinds}) for r in rows]
