"""Measure a running engine (e.g. vLLM): latency vs batch size and context.

The same questions the perf model answers for the modelled engine (prompt time grows with
context, token time with batch), asked of a real replica: the data to fit or check a model
of it (energy.engine_fit)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import numpy as np

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from energy.engine_fit import one_step
from energy.latency_points import LatencyPoint
from engines.protocol import Engine, RequestUsage

_ANY_SLO = SLO(ttft_s=3600, tbt_s=60)


def prompt_of_tokens(count_tokens: Callable[[str], int], tokens: int, salt: str = "") -> str:
    """`salt` + the longest prefix of a fixed text that `count_tokens` (an engine's or a
    model's tokenizer) counts as at most `tokens` tokens in all. A unique salt defeats
    prefix caching, which would otherwise turn every repeated prompt into a cache hit and
    hide the prefill being measured."""
    words = ("Return the number of items in the list and the size of each item " * tokens).split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(salt + " ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return salt + " ".join(words[:lo])


async def measure_latency(engine: Engine, batches: tuple[int, ...], contexts: tuple[int, ...],
                          output_tokens: int, step_tokens: int | None = None) -> list[LatencyPoint]:
    """Send `batch` greedy requests of `context` prompt tokens at once, per (batch, context),
    after one unmeasured request (the first one pays the engine's warm-up). With
    `step_tokens` (the engine's tokens per step), pairs whose prompts exceed one step are
    skipped: the fit leaves them out (energy.engine_fit.one_step)."""
    await _timed(engine, prompt_of_tokens(engine.count_tokens, min(contexts), "warm-up: "), output_tokens)
    points = []
    for context in contexts:
        for batch in batches:
            if not one_step(batch, context, step_tokens):
                continue
            prompts = [prompt_of_tokens(engine.count_tokens, context, f"{uuid.uuid4().hex[:8]}: ")
                       for _ in range(batch)]
            before = engine.stats()
            start = time.perf_counter()
            timed = await asyncio.gather(*(_timed(engine, prompt, output_tokens) for prompt in prompts))
            wall_s = time.perf_counter() - start
            after = engine.stats()
            usages = [u for u, _ in timed]
            gaps = [gap for _, request_gaps in timed for gap in request_gaps]
            points.append(LatencyPoint(
                batch=batch, context_tokens=round(float(np.mean([u.prompt_tokens for u in usages]))),
                output_tokens=output_tokens, tensor_parallel=after.tensor_parallel,
                ttft_s=float(np.mean([u.ttft_s for u in usages])), itl_s=float(np.median(gaps)) if gaps else 0.0,
                tokens_per_s=sum(u.completion_tokens for u in usages) / wall_s,
                energy_j=after.energy_j - before.energy_j, clock_mhz=after.clock_mhz,
            ))
    return points


async def _timed(engine: Engine, prompt: str, output_tokens: int) -> tuple[RequestUsage, list[float]]:
    """The request's usage and the time per token of each chunk after the first (s)."""
    # Past EOS: every request of a point generates output_tokens, so its ITL is that of the batch measured.
    request = Request(f"profile-{uuid.uuid4().hex}", engine.count_tokens(prompt), output_tokens, time.time(),
                      _ANY_SLO, prompt_text=prompt, sampling=Sampling(temperature=0.0, ignore_eos=True))
    gaps: list[float] = []
    last_s: float | None = None
    async for chunk in engine.generate(request):
        if chunk.num_tokens:
            now = time.perf_counter()
            if last_s is not None:
                gaps += [(now - last_s) / chunk.num_tokens] * chunk.num_tokens
            last_s = now
        if chunk.usage is not None:
            return chunk.usage, gaps
    raise RuntimeError(f"engine ended {request.request_id} without usage")


def profile_engine(engine_config: dict, batches: tuple[int, ...], contexts: tuple[int, ...],
                   output_tokens: int, step_tokens: int | None = None) -> list[LatencyPoint]:
    """Start the engine a pool config names (e.g. vLLM), measure it, shut it down."""
    from engines.factory import make_engine

    async def run() -> list[LatencyPoint]:
        engine = make_engine(engine_config)
        try:
            return await measure_latency(engine, batches, contexts, output_tokens, step_tokens)
        finally:
            await engine.shutdown()

    return asyncio.run(run())
