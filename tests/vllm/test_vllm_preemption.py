"""Chiron's mixed replica on real vLLM (tiny offline model, no Ray): an interactive request
preempts a running batch request, which resumes as a continuation whose KV is loaded
through KeepPreemptedKVConnector (vLLM's own prompt-token stats say how much), not
recomputed; its text equals HF's greedy reference either way. Prefix caching is off so
that what is measured is the connector, not vLLM's prefix cache."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from tests.tiny_model_fixture import hf_greedy, loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixtures)
from wattwise.tiny_model import stdlib_docstrings, tiny_engine_config

require_vllm()

from engines.factory import make_engine
from engines.vllm_engine import VllmEngine

BLOCK_TOKENS = tiny_engine_config(Path())["block_size"]
BATCH_PROMPT = stdlib_docstrings()[4][:400]  # 220 tokens: several 32-token KV blocks
BATCH_TOKENS = 160
PREEMPT_AFTER_TOKENS = 40  # the batch request has generated this many when preempted


def _config(model: Path, **overrides) -> dict:
    return tiny_engine_config(model, batch_limit=1, interactive_first=True, enable_prefix_caching=False, **overrides)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, _config(tiny_model))


@pytest.fixture(scope="module")
def reference(tiny_model: Path, engine: VllmEngine) -> str:
    return engine.tokenizer.decode(hf_greedy(tiny_model, BATCH_PROMPT, BATCH_TOKENS))


def _request(engine: VllmEngine, prompt: str, max_tokens: int, rid: str, service_class: str) -> Request:
    return Request(rid, engine.count_tokens(prompt), max_tokens, time.time(), SLO(ttft_s=60, tbt_s=10),
                   service_class=service_class, prompt_text=prompt, sampling=Sampling(temperature=0.0))


@dataclass
class Preempted:
    batch_chunks: list
    batch_done_s: float
    interactive_done_s: float
    arrival_s: float  # of the batch request
    preempted_s: float  # when the interactive request arrived
    generated_before: int  # batch tokens streamed before the preemption
    loaded: int  # continuation prompt tokens whose KV the connector loaded (vLLM's stats)
    computed: int  # ... and that vLLM computed


async def _preempt_once(engine: VllmEngine, tag: str) -> Preempted:
    """A long batch request runs; after PREEMPT_AFTER_TOKENS an interactive one arrives
    and, the batch limit being 1, is admitted only by preempting it."""
    batch_chunks: list = []
    seen = asyncio.Event()

    batch_request = _request(engine, BATCH_PROMPT, BATCH_TOKENS, f"b-{tag}", "batch")

    async def batch() -> float:
        async for chunk in engine.generate(batch_request):
            batch_chunks.append((time.time(), chunk))
            if sum(c.num_tokens for _, c in batch_chunks) >= PREEMPT_AFTER_TOKENS:
                seen.set()
        return time.time()

    batch_task = asyncio.ensure_future(batch())
    await seen.wait()
    preempted_s = time.time()
    before = engine.stats().preemptions
    interactive = _request(engine, "Return the number of", 8, f"i-{tag}", "interactive")
    chunks = [c async for c in engine.generate(interactive)]
    interactive_done_s = time.time()
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].usage.preemptions == 0
    assert engine.stats().preemptions == before + 1
    # The batch request waits (its slot went to the interactive one); from here on vLLM
    # runs only its continuation.
    assert not batch_task.done() and engine.unfinished_in_vllm() == 0
    generated_before = sum(c.num_tokens for _, c in batch_chunks)
    snap = engine.tracker.snapshot
    loaded0, computed0 = snap.prompt_tokens_kv_transfer, snap.prompt_tokens_computed
    batch_done_s = await batch_task
    return Preempted(batch_chunks, batch_done_s, interactive_done_s, batch_request.arrival_s, preempted_s,
                     generated_before,
                     snap.prompt_tokens_kv_transfer - loaded0, snap.prompt_tokens_computed - computed0)


def _check_lossless(engine: VllmEngine, r: Preempted, reference: str) -> None:
    chunks = [c for _, c in r.batch_chunks]
    usage = chunks[-1].usage
    assert r.interactive_done_s < r.batch_done_s
    assert PREEMPT_AFTER_TOKENS <= r.generated_before < BATCH_TOKENS
    assert usage.preemptions == 1 and usage.completion_tokens == BATCH_TOKENS
    assert sum(c.num_tokens for c in chunks) == BATCH_TOKENS  # no duplicate, no gap
    assert usage.prompt_tokens == engine.count_tokens(BATCH_PROMPT)
    # TTFT is the first token ever (before the preemption); E2E spans the whole run.
    assert usage.ttft_s > 0 and r.arrival_s + usage.ttft_s <= r.batch_chunks[0][0] < r.preempted_s
    assert usage.e2e_s - usage.ttft_s > r.interactive_done_s - r.preempted_s
    assert usage.max_tbt_s > 0
    assert "".join(c.text for c in chunks) == reference


def test_interactive_preempts_batch_and_the_resume_loads_its_kv(engine: VllmEngine, reference: str, loop) -> None:
    before = engine.stats().preemptions
    r = loop.run_until_complete(_preempt_once(engine, "keep"))
    _check_lossless(engine, r, reference)
    assert engine.stats().preemptions == before + 1
    # The continuation's prompt is the original prompt plus the tokens generated before
    # the preemption; vLLM loaded every full KV block of it but the one holding its last
    # token (that one is computed to get the next token's logits): prompt AND generated
    # tokens' KV came back through the connector.
    resumed = engine.count_tokens(BATCH_PROMPT) + r.generated_before
    print(f"\nkept KV: continuation prompt {resumed} tokens, loaded {r.loaded}, computed {r.computed}")
    assert r.loaded == (resumed - 1) // BLOCK_TOKENS * BLOCK_TOKENS > engine.count_tokens(BATCH_PROMPT)
    assert r.computed == resumed - r.loaded
    assert any(Path(engine.kv_transfer.storage_path).glob("*.safetensors"))  # the engine's own directory


def test_without_the_connector_the_resume_recomputes_to_the_same_text(tiny_model: Path, reference: str) -> None:
    async def run() -> tuple[VllmEngine, Preempted]:
        engine = make_engine(_config(tiny_model, keep_preempted_kv=False))
        try:
            assert engine.kv_transfer is None
            return engine, await _preempt_once(engine, "recompute")
        finally:
            await engine.shutdown()

    engine, r = asyncio.run(run())
    _check_lossless(engine, r, reference)
    resumed = engine.count_tokens(BATCH_PROMPT) + r.generated_before
    print(f"\nrecompute: continuation prompt {resumed} tokens, loaded {r.loaded}, computed {r.computed}")
    assert (r.loaded, r.computed) == (0, resumed)


async def _batch_until_cancelled(engine: VllmEngine, rid: str, chunks: list) -> None:
    async for chunk in engine.generate(_request(engine, BATCH_PROMPT, BATCH_TOKENS, rid, "batch")):
        chunks.append(chunk)


async def _until(condition, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_disconnect_of_a_preempted_batch_request_frees_it(engine: VllmEngine, loop) -> None:
    """Client gone while the preempted request waits, and while its continuation runs."""

    async def run() -> None:
        # 1. Gone while waiting: nothing of it is left in vLLM or in the gate.
        chunks: list = []
        batch_task = asyncio.ensure_future(_batch_until_cancelled(engine, "b-gone", chunks))
        await _until(lambda: chunks)
        interactive = engine.generate(_request(engine, "Return the number of", 60, "i-gone", "interactive"))
        await interactive.__anext__()  # admitted: the batch request was preempted
        assert engine.gate.active == 1 and engine.gate.waiting == 1 and engine.unfinished_in_vllm() == 1
        batch_task.cancel()  # its client goes away while it waits
        with pytest.raises(asyncio.CancelledError):
            await batch_task
        assert engine.gate.waiting == 0 and engine.stats().queued_requests == 0
        rest = [c async for c in interactive]
        assert rest[-1].usage.completion_tokens == 60
        await asyncio.sleep(0.2)
        assert engine.unfinished_in_vllm() == 0 and engine.gate.active == 0
        # 2. Gone while its continuation runs: the continuation is aborted in vLLM.
        chunks = []
        batch_task = asyncio.ensure_future(_batch_until_cancelled(engine, "b-gone2", chunks))
        await _until(lambda: chunks)
        [c async for c in engine.generate(_request(engine, "Return the number of", 8, "i-gone2", "interactive"))]
        streamed = len(chunks)
        await _until(lambda: len(chunks) > streamed)  # resumed
        assert engine.unfinished_in_vllm() == 1
        batch_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch_task
        await asyncio.sleep(0.2)
        assert engine.unfinished_in_vllm() == 0 and engine.gate.active == 0 and engine.gate.waiting == 0

    loop.run_until_complete(run())
    stats = engine.stats()
    assert stats.running_requests == 0 and stats.queued_requests == 0 and stats.pending_decode_tokens == 0
