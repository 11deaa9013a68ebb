"""A replica deployment: one engine, its admission queue, stats and metrics.

Every pool (DynamoLLM class pool, later Splitwise prompt/token and Chiron kinds) is
this class deployed under its own name with its own autoscaling config.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from core.request import Request
from deployments.metrics import ReplicaMetrics
from deployments.tracing import tracer
from engines.protocol import GenerationChunk
from engines.sim_engine import SimEngine, SimEngineConfig


@serve.deployment
class LLMReplica:
    def __init__(self, pool: str, engine_config: dict[str, Any], stream_flush_s: float = 0.05) -> None:
        self.pool = pool
        self.engine = SimEngine(SimEngineConfig(**engine_config))
        self.stream_flush_s = stream_flush_s
        self.metrics = ReplicaMetrics(pool)

    async def generate(self, request: Request) -> AsyncIterator[dict[str, Any]]:
        """Stream dicts of {text, num_tokens, finish_reason, usage}; the first token is
        sent at once, later ones batched every `stream_flush_s` (each yield is a Ray object)."""
        with tracer.start_as_current_span("wattwise.replica.generate") as span:
            span.set_attribute("wattwise.pool", self.pool)
            span.set_attribute("wattwise.length_class", request.length_class)
            text: list[str] = []
            tokens = 0
            last_flush = 0.0
            async for chunk in self.engine.generate(request):
                text.append(chunk.text)
                tokens += chunk.num_tokens
                now = time.monotonic()
                if chunk.finish_reason is not None:
                    self._record(request, chunk)
                    span.set_attribute("wattwise.energy_j", chunk.usage.energy_j if chunk.usage else 0.0)
                    yield _chunk_dict("".join(text), tokens, chunk)
                    return
                if last_flush == 0.0 or now - last_flush >= self.stream_flush_s:
                    yield {"text": "".join(text), "num_tokens": tokens, "finish_reason": None, "usage": None}
                    text.clear()
                    tokens = 0
                    last_flush = now

    async def complete(self, request: Request) -> dict[str, Any]:
        """Whole response in one reply: no per-chunk cost for non-streaming clients."""
        text: list[str] = []
        async for chunk in self.engine.generate(request):
            text.append(chunk.text)
            if chunk.finish_reason is not None:
                self._record(request, chunk)
                return _chunk_dict("".join(text), chunk.usage.completion_tokens if chunk.usage else 0, chunk)
        raise RuntimeError(f"engine ended request {request.request_id} without a final chunk")

    def _record(self, request: Request, chunk: GenerationChunk) -> None:
        if chunk.usage is not None:
            self.metrics.record_request(request.length_class, request.service_class, chunk.usage, chunk.finish_reason)

    def record_autoscaling_stats(self) -> dict[str, float]:
        stats = self.engine.stats()
        self.metrics.record_stats(stats)
        return stats.to_metrics()

    def record_routing_stats(self) -> dict[str, float]:
        stats = self.engine.stats()
        return {"pending_tokens": float(stats.pending_prompt_tokens + stats.pending_decode_tokens)}

    def set_batch_limit(self, limit: int) -> int:
        self.engine.set_batch_limit(limit)
        return self.engine.stats().batch_limit

    async def __del__(self) -> None:
        await self.engine.shutdown()


def _chunk_dict(text: str, num_tokens: int, chunk: GenerationChunk) -> dict[str, Any]:
    usage = chunk.usage
    return {
        "text": text,
        "num_tokens": num_tokens,
        "finish_reason": chunk.finish_reason,
        "usage": None if usage is None else {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "energy_j": usage.energy_j,
            "ttft_s": usage.ttft_s,
            "e2e_s": usage.e2e_s,
            "max_tbt_s": usage.max_tbt_s,
        },
    }
