"""vLLM's admission gate runs the simulated replicas' admission chain (throttLL'eM), on
the tiny offline model: a request whose admission would break a running request's TBT
target waits, though the batch limit has room, and runs once the replica is free."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from tests.tiny_model_fixture import loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixtures)
from wattwise.tiny_model import tiny_engine_config

require_vllm()

from engines.vllm_engine import VllmEngine

PROMPT = "Return the number of items in the"
# M of a GPU the tiny engine's TP1 exists on: the rule's inputs, not its speed, are under test.
THROTTLLEM = {"model": "llama3.1-8b", "hardware": "h100-80gb"}


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model, batch_limit=4, throttllem=THROTTLLEM))


def _request(engine: VllmEngine, rid: str, max_tokens: int, slo: SLO) -> Request:
    return Request(rid, engine.count_tokens(PROMPT), max_tokens, time.time(), slo, prompt_text=PROMPT,
                   sampling=Sampling(temperature=0.0), predicted_output_tokens=max_tokens)


def test_a_request_that_would_break_a_running_tbt_target_waits_for_it(engine: VllmEngine, loop) -> None:
    assert engine.gate.admits is not None

    async def run() -> tuple[float, float, list, list, int]:
        # No GPU steps 0.1 ms apart: "strict" is admitted only because the replica is empty
        # (throttLL'eM marks it lost), and its target then rules out any company.
        strict = _request(engine, "strict", 48, SLO(ttft_s=60, tbt_s=1e-4))
        loose = _request(engine, "loose", 8, SLO(ttft_s=60, tbt_s=10))
        first_done = asyncio.Event()
        finished_s: dict[str, float] = {}
        first_token_s: dict[str, float] = {}

        async def collect(request: Request) -> list:
            chunks = []
            async for chunk in engine.generate(request):
                first_token_s.setdefault(request.request_id, time.monotonic())
                chunks.append(chunk)
            finished_s[request.request_id] = time.monotonic()
            first_done.set()
            return chunks

        refused_before = engine.gate.refused
        strict_task = asyncio.ensure_future(collect(strict))
        while "strict" not in first_token_s:
            await asyncio.sleep(0.01)
        loose_task = asyncio.ensure_future(collect(loose))
        strict_chunks, loose_chunks = await asyncio.gather(strict_task, loose_task)
        return (finished_s["strict"], first_token_s["loose"], strict_chunks, loose_chunks,
                engine.gate.refused - refused_before)

    strict_done_s, loose_first_s, strict_chunks, loose_chunks, refused = loop.run_until_complete(run())
    assert sum(c.num_tokens for c in strict_chunks) == 48 and sum(c.num_tokens for c in loose_chunks) == 8
    assert refused >= 1 and loose_first_s >= strict_done_s  # it waited for the strict one to leave
    assert engine.gate.active == 0 and engine.gate.waiting == 0 and engine.running_batch.running == []


def test_requests_that_harm_no_one_share_the_batch(engine: VllmEngine, loop) -> None:
    async def run() -> tuple[int, int]:
        loose = [_request(engine, f"share{i}", 24, SLO(ttft_s=60, tbt_s=10)) for i in range(3)]
        peak = 0
        tasks = [asyncio.ensure_future(_drain(engine, r)) for r in loose]
        while not all(t.done() for t in tasks):
            peak = max(peak, engine.gate.active)
            await asyncio.sleep(0.01)
        done = [await t for t in tasks]
        return peak, sum(done)

    peak, tokens = loop.run_until_complete(run())
    assert tokens == 72 and peak >= 2


async def _drain(engine: VllmEngine, request: Request) -> int:
    return sum([c.num_tokens async for c in engine.generate(request)])
