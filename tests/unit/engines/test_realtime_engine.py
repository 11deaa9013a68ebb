"""The real-time modelled engine: streams, timing against the model, abort on close."""

import asyncio
import time

from core.request import Request
from core.slo import SLO
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig


def _req(rid: str, prompt: int, out: int) -> Request:
    return Request(rid, prompt, out, time.time(), SLO(ttft_s=1, tbt_s=0.1))


def test_streams_exact_tokens_in_modelled_time() -> None:
    async def main() -> tuple[int, float, object]:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8))
        start = time.monotonic()
        tokens = 0
        usage = None
        async for chunk in engine.generate(_req("a", 100, 40)):
            tokens += chunk.num_tokens
            usage = chunk.usage or usage
        await engine.shutdown()
        return tokens, time.monotonic() - start, usage

    tokens, wall_s, usage = asyncio.run(main())
    assert tokens == 40 and usage.completion_tokens == 40 and usage.energy_j > 0
    # 40 steps of ~16 ms at TP8: the engine really waits for the modelled time (the upper
    # bound only catches a runaway; a busy machine may stretch the waits several-fold).
    assert 0.5 < wall_s < 10.0
    assert usage.e2e_s > usage.ttft_s > 0


def test_closing_the_stream_aborts_the_request() -> None:
    async def main() -> tuple[int, int]:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8))
        gen = engine.generate(_req("b", 100, 10_000))
        await gen.__anext__()
        running = engine.stats().running_requests
        await gen.aclose()
        after = engine.stats()
        await engine.shutdown()
        return running, after.running_requests + after.kv_blocks_used

    running, left = asyncio.run(main())
    assert running == 1 and left == 0


def test_concurrent_requests_share_batches() -> None:
    async def one(engine: ModelledEngine, i: int) -> int:
        n = 0
        async for chunk in engine.generate(_req(f"c{i}", 50, 30)):
            n += chunk.num_tokens
        return n

    async def main() -> tuple[list[int], float]:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8))
        start = time.monotonic()
        counts = await asyncio.gather(*(one(engine, i) for i in range(16)))
        await engine.shutdown()
        return counts, time.monotonic() - start

    counts, wall_s = asyncio.run(main())
    assert counts == [30] * 16
    assert wall_s < 10.0  # batched (~1 s when idle): less than 16 x 30 sequential steps (~15 s)


def test_profiling_skips_batches_whose_prompts_exceed_one_step() -> None:
    """engines.latency_profiling on the modelled engine: a (batch, context) pair over the step
    budget is not measured (its TTFT and ITL would span chunked, mixed steps)."""
    from engines.latency_profiling import measure_latency

    async def main() -> list[tuple[int, int]]:
        engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=8))
        points = await measure_latency(engine, (1, 2), (16, 64), output_tokens=2, step_tokens=64)
        await engine.shutdown()
        return [(p.batch, p.context_tokens) for p in points]

    assert asyncio.run(main()) == [(1, 16), (2, 16), (1, 64)]
