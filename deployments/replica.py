"""A replica deployment: one engine, its admission queue, stats and metrics.

Every pool (DynamoLLM class pool, later Splitwise prompt/token and Chiron kinds) is
this class deployed under its own name with its own autoscaling config.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from app.splitwise_config import SplitwiseServeConfig
from autoscaling.chiron.local import LocalAutoscalerConfig, LocalBatchAutoscaler
from core.plan import ClusterPlan
from core.request import Request
from deployments.gpu_actor import gpu_actor_for_this_node
from deployments.kv_handoff import KvHandle, run_prompt, run_tokens
from deployments.metrics import ReplicaMetrics
from deployments.plan_store import follow_plan
from deployments.tracing import tracer
from batching.continuous_batcher import RequestShed
from engines.factory import make_engine
from engines.protocol import GenerationChunk, RequestSquashed, TensorParallelChangeUnsupported

logger = logging.getLogger("ray.serve")


@serve.deployment
class LLMReplica:
    def __init__(self, pool: str, engine_config: dict[str, Any], stream_flush_s: float = 0.05,
                 local_autoscaler: dict[str, Any] | None = None) -> None:
        self.pool = pool
        self.engine = make_engine(engine_config)
        self.stream_flush_s = stream_flush_s
        self.metrics = ReplicaMetrics(pool)
        context = serve.get_replica_context()
        self.app_name, self.deployment = context.app_name, context.deployment
        self.gpu_ids = self.engine.gpu_ids  # with TP > 1 its workers', not this actor's
        self._follower: asyncio.Task | None = None
        self.local = LocalBatchAutoscaler(LocalAutoscalerConfig(**local_autoscaler)) if local_autoscaler else None
        if self.local is not None:
            self.engine.set_batch_limit(self.local.limit)
        self._local_task: asyncio.Task | None = None
        self._clock_task: asyncio.Task | None = None
        # What the GPUs run at, as the GPU-control actor reads it back (None: not read yet).
        self.applied_clock_mhz: float | None = None
        self._refused_tp: int | None = None  # the last plan TP the engine could not take

    def _ensure_following_plan(self) -> None:
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(follow_plan(self.app_name, self.apply_plan))
        if self.local is not None and (self._local_task is None or self._local_task.done()):
            self._local_task = asyncio.get_running_loop().create_task(self._local_autoscale())
        if self.gpu_ids and (self._clock_task is None or self._clock_task.done()):
            self._clock_task = asyncio.get_running_loop().create_task(self._forward_clock())

    async def _forward_clock(self, period_s: float = 1.0) -> None:
        """Engine-side clock choices (throttLL'eM's per-step throttling, the plan's clock) reach
        the real GPUs through the node's privileged actor, off the request path and
        rate-limited there. The target is sent every period, not once: a change the actor
        refused (rate limit, hold after an NVML error, a restarting actor) or undid (fail-static
        reset) is sent again, and the governor skips a lock the GPU already has without
        calling NVML. Each period also reads back the clocks the GPUs run at, which is what
        the clock metric reports (not the target)."""
        actor = gpu_actor_for_this_node(self.engine.config.hardware)
        while True:
            clock = self.engine.stats().clock_mhz
            try:
                if clock:
                    await actor.set_clock.remote(self.gpu_ids, clock)
                read = [c for c in await actor.clocks_mhz.remote(self.gpu_ids) if c is not None]
                self.applied_clock_mhz = float(min(read)) if read else None
            except ray.exceptions.RayError as exc:  # the actor restarts (max_restarts=-1): try again
                logger.warning("wattwise: GPU-control actor unavailable (%s); retrying the clock", exc)
                self.applied_clock_mhz = None
            await asyncio.sleep(period_s)

    async def _local_autoscale(self, period_s: float = 1.0) -> None:
        """Chiron's Algorithm 1 on this replica's own counters, every `period_s`."""
        while True:
            await asyncio.sleep(period_s)
            slo = self.engine.min_tbt_slo_s()
            if slo is None:
                continue
            s = self.engine.stats()
            self.engine.set_batch_limit(
                self.local.update(s.itl_ewma_s, slo, s.tokens_per_s, s.running_requests, s.tokens_generated))

    def apply_plan(self, plan: ClusterPlan) -> None:
        """Take this pool's TP, clock and batch limit from the controller's plan. A TP the
        engine cannot take in place (vLLM, a pool without shadow deployments for it) is
        logged once and skipped: the clock and batch limit still apply."""
        name = self.deployment
        tp = plan.tensor_parallel.get(name)
        if tp is not None and tp != self.engine.stats().tensor_parallel:
            try:
                self.engine.set_tensor_parallel(tp)
            except TensorParallelChangeUnsupported as exc:
                if tp != self._refused_tp:
                    logger.warning("wattwise: %s keeps its TP: %s", name, exc)
                    self._refused_tp = tp
        if name in plan.batch_limit and self.local is None:  # the local autoscaler owns it otherwise
            self.engine.set_batch_limit(plan.batch_limit[name])
        # A plan clock is a pin (a policy that owns the clock, or an operator's): the band
        # collapses on it, so no per-step hook moves it. Real GPUs follow via _forward_clock.
        band = plan.clock_band_mhz.get(name)
        if name in plan.clock_mhz:
            band = (plan.clock_mhz[name], plan.clock_mhz[name])
        if band is not None:
            self.engine.set_clock_band(*band)

    async def check_health(self) -> None:
        """Serve calls this every few seconds: it also keeps the plan follower alive."""
        self._ensure_following_plan()

    async def generate(self, request: Request) -> AsyncIterator[dict[str, Any]]:
        """Stream dicts of {text, num_tokens, finish_reason, usage}; the first token is
        sent at once, later ones batched every `stream_flush_s` (each yield is a Ray object)."""
        async for item in self._flushed(request, self.engine.generate(request)):
            yield item

    async def prefill(self, request: Request, settings: dict[str, Any], token_replica: str) -> dict[str, Any]:
        """Splitwise prompt phase (deployments.kv_handoff): {chunk: the first token (None
        with vLLM), kv: the KvHandle for `token_replica`, replica: this one}, or a refusal."""
        self._ensure_following_plan()
        replica = serve.get_replica_context().replica_id.unique_id
        try:
            first, kv = await run_prompt(self.engine, request, SplitwiseServeConfig(**settings), replica,
                                         token_replica == replica)
        except RequestSquashed as exc:
            return {"chunk": _squashed(exc), "kv": None, "replica": replica}
        except RequestShed as exc:
            return {"chunk": _shed(exc), "kv": None, "replica": replica}
        if first is not None and first.finish_reason is not None:
            self._record(request, first)
        chunk = None if first is None else _chunk_dict(first.text, first.num_tokens, first)
        return {"chunk": chunk, "kv": kv, "replica": replica}

    async def decode(self, request: Request, kv: KvHandle, timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """Splitwise token phase: stream the rest of the request from the prompt replica's
        KV (recomputing the prompt if it does not arrive); the last chunk says how it came."""
        outcome: list[str] = []
        replica = serve.get_replica_context().replica_id.unique_id
        async for item in self._flushed(request, run_tokens(self.engine, request, kv, replica, timeout_s, outcome)):
            if item.get("finish_reason") is not None:
                item["kv"] = outcome[0] if outcome else None
                item["replica"] = replica
            yield item

    async def _flushed(self, request: Request, chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[dict[str, Any]]:
        self._ensure_following_plan()
        with tracer.start_as_current_span("wattwise.replica.generate") as span:
            span.set_attribute("wattwise.pool", self.pool)
            span.set_attribute("wattwise.length_class", request.length_class)
            text: list[str] = []
            tokens = 0
            last_flush = 0.0
            try:
                async for chunk in chunks:
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
            except (RequestSquashed, RequestShed) as exc:
                yield self._refused(exc)

    async def complete(self, request: Request) -> dict[str, Any]:
        """Whole response in one reply: no per-chunk cost for non-streaming clients."""
        self._ensure_following_plan()
        text: list[str] = []
        try:
            async for chunk in self.engine.generate(request):
                text.append(chunk.text)
                if chunk.finish_reason is not None:
                    self._record(request, chunk)
                    return _chunk_dict("".join(text), chunk.usage.completion_tokens if chunk.usage else 0, chunk)
        except (RequestSquashed, RequestShed) as exc:
            return self._refused(exc)
        raise RuntimeError(f"engine ended request {request.request_id} without a final chunk")

    def _refused(self, exc: RequestSquashed | RequestShed) -> dict[str, Any]:
        """The reply for a request the engine refused (squashed after waiting, or shed)."""
        if isinstance(exc, RequestSquashed):
            self.metrics.record_refusal("squashed")
            return _squashed(exc)
        self.metrics.record_refusal("shed")
        return _shed(exc)

    def _record(self, request: Request, chunk: GenerationChunk) -> None:
        if chunk.usage is not None:
            self.metrics.record_request(request.length_class, request.service_class, chunk.usage, chunk.finish_reason)

    def record_autoscaling_stats(self) -> dict[str, float]:
        stats = self.engine.stats()
        # Modelled GPUs run at the engine's clock; real ones at what the actor read back.
        self.metrics.record_stats(stats, self.applied_clock_mhz if self.gpu_ids else stats.clock_mhz)
        return stats.to_metrics()

    def record_routing_stats(self) -> dict[str, float]:
        stats = self.engine.stats()
        return {"pending_tokens": float(stats.pending_prompt_tokens + stats.pending_decode_tokens)}

    async def __del__(self) -> None:
        await self.engine.shutdown()


def _squashed(exc: RequestSquashed) -> dict[str, Any]:
    return {"squashed": True, "waited_s": exc.waited_s, "text": "", "num_tokens": 0, "finish_reason": None,
            "usage": None}


def _shed(exc: RequestShed) -> dict[str, Any]:
    """Overload at arrival (queue cap or wait past the TTFT target): answered, not raised,
    so the ingress can tell it from a replica failure and reply 503 + Retry-After."""
    return {"rejected": True, "reason": exc.reason, "retry_after_s": exc.retry_after_s, "text": "",
            "num_tokens": 0, "finish_reason": None, "usage": None}


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
