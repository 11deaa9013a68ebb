"""The replica side of Splitwise's prompt -> token hand-off (§IV-C) in Ray Serve.

A prompt replica runs the prompt (and its first token), then hands the token replica a
KvHandle whose KV sits in Ray's object store; the token replica fetches it with a
timeout. With the simulated engine the KV is a payload sized like the real cache
(energy.kv_transfer bytes per token, scaled down). With vLLM and our connector it is the
prompt's real KV blocks (engines.kv_block_files), which the token replica's engine loads
instead of computing them; a connector of vLLM's own (ExampleConnector, NixlConnector)
moves the KV itself. A transfer that fails or times out is not fatal: the token replica
recomputes the prompt, as vLLM's connector does on a miss.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import ray
from ray.exceptions import RayError

from app.splitwise_config import SplitwiseServeConfig
from batching.continuous_batcher import Sequence
from core.request import Request
from energy.hardware import MODELS
from energy.kv_transfer import KVTransferModel
from engines.protocol import Engine, GenerationChunk

OBJECT_STORE, CONNECTOR, LOCAL, RECOMPUTED = "object_store", "connector", "local", "recomputed"


@dataclasses.dataclass(frozen=True)
class KvHandle:
    """What a prompt replica hands its token replica. `ref` points at the KV payload in
    the object store (nested in this object, so Ray does not resolve it on the way)."""

    source_replica: str
    via: str  # OBJECT_STORE, CONNECTOR or LOCAL (the token phase runs on this same replica)
    nbytes: int = 0
    ref: Any = None
    lost: bool = False  # the prompt replica dropped the payload (failure injection)
    generated: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    energy_j: float = 0.0
    max_tbt_s: float = 0.0


def kv_payload_bytes(engine: Engine, prompt_tokens: int, scale: float) -> int:
    config = engine.config
    model = KVTransferModel(MODELS[config.model])
    return max(math.ceil(model.bytes_per_link(prompt_tokens, config.tensor_parallel) * scale), 1)


def _shipped(replica: str, payload: Any, nbytes: int, settings: SplitwiseServeConfig, **state: Any) -> KvHandle:
    """The KV put into the object store, or dropped (failure injection) or missing (None)."""
    if payload is None or random.random() < settings.transfer_failure_prob:
        return KvHandle(replica, OBJECT_STORE, nbytes, lost=payload is not None, **state)
    return KvHandle(replica, OBJECT_STORE, nbytes, ray.put(payload), **state)


async def _vllm_prompt(engine: Any, request: Request, settings: SplitwiseServeConfig, replica: str) -> KvHandle:
    if engine.blocks is None:  # a connector of vLLM's own stores the prompt's KV and moves it
        await engine.prefill(request)
        return KvHandle(replica, CONNECTOR)
    blocks = await engine.export_prompt_kv(request, settings.kv_transfer_timeout_s)
    return _shipped(replica, blocks, sum(map(len, blocks.values())) if blocks else 0, settings)


async def run_prompt(engine: Engine, request: Request, settings: SplitwiseServeConfig, replica: str,
                     same_replica: bool) -> tuple[GenerationChunk | None, KvHandle]:
    """The prompt phase: the first token (None with vLLM, whose token replica streams every
    token from the KV) and the KvHandle for the token replica."""
    if not hasattr(engine, "resume"):
        return None, await _vllm_prompt(engine, request, settings, replica)
    one = dataclasses.replace(request, max_tokens=1, target_output_tokens=1)
    final = None
    async for chunk in engine.generate(one):
        final = chunk
    if final is None or final.usage is None:
        raise RuntimeError(f"prompt phase of {request.request_id} ended without a final chunk")
    usage = final.usage
    done = request.output_tokens_to_generate <= usage.completion_tokens
    first = GenerationChunk(final.text, final.num_tokens,
                            ("length" if request.max_tokens <= usage.completion_tokens else "stop") if done else None,
                            usage if done else None)
    state: dict[str, Any] = {"generated": usage.completion_tokens, "first_token_s": request.arrival_s + usage.ttft_s,
             "last_token_s": request.arrival_s + usage.e2e_s, "energy_j": usage.energy_j,
             "max_tbt_s": usage.max_tbt_s}
    if done or same_replica:
        return first, KvHandle(replica, LOCAL, **state)
    nbytes = kv_payload_bytes(engine, request.prompt_tokens, settings.kv_payload_scale)
    return first, _shipped(replica, bytes(nbytes), nbytes, settings, **state)


async def await_ref(ref: Any) -> Any:
    """An ObjectRef or a Serve response as a coroutine (asyncio.wait_for needs one to time it out)."""
    return await ref


async def fetch_kv(kv: KvHandle, timeout_s: float) -> Any | None:
    """The KV payload; None if it is missing, lost, failed or late (then recompute).
    A dropped payload is noticed only at the timeout, as a lost transfer would be."""
    if kv.lost:
        await asyncio.sleep(timeout_s)
    if kv.ref is None:
        return None
    try:
        return await asyncio.wait_for(await_ref(kv.ref), timeout_s)
    except (TimeoutError, RayError):
        return None


async def _vllm_tokens(engine: Any, request: Request, kv: KvHandle, timeout_s: float,
                       outcome: list[str]) -> AsyncGenerator[GenerationChunk, None]:
    if kv.via == CONNECTOR:  # vLLM's own connector loads the KV (or recomputes on a miss)
        outcome.append(CONNECTOR)
        async with aclosing(engine.generate(request)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    blocks = await fetch_kv(kv, timeout_s)
    keys = engine.import_kv(blocks) if blocks else []
    outcome.append(OBJECT_STORE if keys else RECOMPUTED)
    try:
        async with aclosing(engine.generate(request)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        engine.release_kv(keys)


async def run_tokens(engine: Engine, request: Request, kv: KvHandle, replica: str, timeout_s: float,
                     outcome: list[str]) -> AsyncGenerator[GenerationChunk, None]:
    """The token phase on `replica` from the prompt replica's KV; `outcome` gets how the
    KV arrived (LOCAL KV on another replica, if routing fell back, is not there: recompute)."""
    if not hasattr(engine, "resume"):
        async with aclosing(_vllm_tokens(engine, request, kv, timeout_s, outcome)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    if kv.via == LOCAL:
        present = kv.source_replica == replica
    else:
        payload = await fetch_kv(kv, timeout_s)
        present = payload is not None and len(payload) == kv.nbytes
    outcome.append(kv.via if present else RECOMPUTED)
    prior = Sequence(request=request, enqueued_s=request.arrival_s, generated=kv.generated,
                     first_token_s=kv.first_token_s, last_token_s=kv.last_token_s, energy_j=kv.energy_j,
                     max_tbt_s=kv.max_tbt_s)
    async with aclosing(engine.resume(request, prior, present)) as resumed:
        async for chunk in resumed:
            yield chunk
