"""A pool replica: one engine, its admission queue, stats and metrics.

Every pool (DynamoLLM class pool, later Splitwise prompt/token and Chiron kinds) is
this class deployed under its own name with its own autoscaling config. It is a plain
class that receives its engine and identity; deployments.builder makes it a Serve
deployment (building the engine from the pool's config in the replica), so tests
construct it directly. What it sends back is typed (deployments.messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from opentelemetry.trace import StatusCode

from app.splitwise_config import SplitwiseServeConfig
from autoscaling.chiron.local import LocalAutoscalerConfig, LocalBatchAutoscaler
from batching.continuous_batcher import RequestOverflowed, RequestShed
from core.overheads import OverheadTable
from core.plan import ClusterPlan
from core.published_plan import PublishedPlan
from core.request import Request
from deployments.gpu_actor import gpu_actor_for_this_node
from deployments.kv_handoff import KvHandle, run_prompt, run_tokens
from deployments.kv_router import MAX_REPORTED_BLOCKS, PREFIX_BLOCKS_STAT, occupancy_stats
from deployments.messages import Prefilled, Refusal, ReplicaChunk, Reply, Shed, Squashed
from deployments.metrics import ReplicaMetrics
from deployments.token_router import PENDING_TOKENS_STAT
from deployments.tracing import tracer
from engines.protocol import Engine, GenerationChunk, RequestSquashed, TensorParallelChangeUnsupported

logger = logging.getLogger("ray.serve")

# Follows the controller's plan forever, calling its argument with each new plan
# (deployments.plan_store.follow_plan for this replica's app).
PlanFollower = Callable[[Callable[[PublishedPlan], None]], Coroutine[Any, Any, None]]


@dataclass
class _Stream:
    """One request's stream on this replica: the task driving it now (Serve drives a stream
    from one task; a caller may pull each chunk from another), and when it ended (the engine
    has let go of the request id)."""

    task: asyncio.Task | None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class ReplicaIdentity:
    """Where a replica runs in Serve: its app, deployment and replica id."""

    app_name: str
    deployment: str
    replica_id: str


class LLMReplica:
    def __init__(self, pool: str, engine: Engine, identity: ReplicaIdentity, stream_flush_s: float = 0.05,
                 local_autoscaler: LocalAutoscalerConfig | None = None, follow_plan: PlanFollower | None = None,
                 metrics: ReplicaMetrics | None = None) -> None:
        self.pool = pool
        self.engine = engine
        self.identity = identity
        self.deployment = identity.deployment
        self.stream_flush_s = stream_flush_s
        self.metrics = metrics if metrics is not None else ReplicaMetrics(pool)
        self.gpu_ids = self.engine.gpu_ids  # with TP > 1 its workers', not this actor's
        self._follow_plan = follow_plan  # None: no controller (tests apply plans themselves)
        self._follower: asyncio.Task | None = None
        self.local = LocalBatchAutoscaler(local_autoscaler) if local_autoscaler else None
        if self.local is not None:
            self.engine.set_batch_limit(self.local.limit)
        self._local_task: asyncio.Task | None = None
        self._clock_task: asyncio.Task | None = None
        self._stop_forwarding = asyncio.Event()  # set as the replica stops
        # What the GPUs run at, as the GPU-control actor reads it back (None: not read yet).
        self.applied_clock_mhz: float | None = None
        self._refused_tp: int | None = None  # the last plan TP the engine could not take
        self._streaming: dict[str, _Stream] = {}  # request id -> its stream here

    def _ensure_following_plan(self) -> None:
        if self._follow_plan is not None and (self._follower is None or self._follower.done()):
            self._follower = asyncio.get_running_loop().create_task(self._follow_plan(self.apply_plan))
        if self.local is not None and (self._local_task is None or self._local_task.done()):
            self._local_task = asyncio.get_running_loop().create_task(self._local_autoscale())
        stopped = self._stop_forwarding.is_set()  # the replica released its GPUs: no more locks
        if self.gpu_ids and not stopped and (self._clock_task is None or self._clock_task.done()):
            self._clock_task = asyncio.get_running_loop().create_task(self._forward_clock())

    async def _forward_clock(self, period_s: float = OverheadTable().clock_forward_period_s) -> None:
        """Engine-side clock choices (throttLL'eM's per-step throttling, the plan's clock) reach
        the real GPUs through the node's privileged actor, off the request path: the engine
        only changes its target, and this loop sends the latest one every period (choices
        in between are coalesced, so a GPU takes at most one change per period).
        The target is sent every period, not once: a change the actor refused (rate limit,
        hold after an NVML error, a restarting actor) or undid (fail-static reset) is sent
        again, the governor skips a lock the GPU already has without calling NVML, and each
        send renews this replica's lease on its GPUs (a replica that dies without cleanup
        stops renewing, and the actor resets them: deployments.gpu_actor). Each period also
        reads back the clocks the GPUs run at, which is what the clock metric reports (not
        the target) and what the engine's clock rule plans with until its choice lands."""
        actor = gpu_actor_for_this_node(self.engine.config.hardware)
        while not self._stop_forwarding.is_set():
            started_s = time.monotonic()
            clock = self.engine.stats().clock_mhz
            try:
                if clock:
                    await actor.set_clock.remote(self.identity.replica_id, self.gpu_ids, clock)
                read = [c for c in await actor.clocks_mhz.remote(self.gpu_ids) if c is not None]
                self.applied_clock_mhz = float(min(read)) if read else None
            except ray.exceptions.RayError as exc:  # the actor restarts (max_restarts=-1): try again
                logger.warning("wattwise: GPU-control actor unavailable (%s); retrying the clock", exc)
                self.applied_clock_mhz = None
            self.engine.clock_applied(self.applied_clock_mhz)
            try:  # every period from the last send's start, however long NVML took
                await asyncio.wait_for(self._stop_forwarding.wait(), max(period_s - (time.monotonic() - started_s), 0))
            except TimeoutError:
                pass

    async def _release_gpus(self, timeout_s: float = 10.0) -> None:
        """Stop forwarding and put this replica's GPUs back at the driver's default clocks (a
        graceful stop: redeploy, downscale, `serve shutdown`). The last forward is awaited
        first: the actor serves calls at once, so a lock still on its way could otherwise land
        after the release. If the actor cannot be reached in time, the lease it holds lapses
        and the actor resets them anyway."""
        self._stop_forwarding.set()
        if self._clock_task is not None:
            await asyncio.wait({self._clock_task}, timeout=timeout_s)
        if not self.gpu_ids:
            return
        try:
            actor = gpu_actor_for_this_node(self.engine.config.hardware)
            await asyncio.wait_for(actor.release.remote(self.identity.replica_id), timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            logger.warning("wattwise: GPUs %s not released (%s); their lease lapses instead", self.gpu_ids, exc)

    async def _local_autoscale(self, period_s: float = 1.0) -> None:
        """Chiron's Algorithm 1 on this replica's own counters, every `period_s`."""
        while True:
            await asyncio.sleep(period_s)
            slo = self.engine.min_tbt_slo_s()
            if slo is None or self.local is None:
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

    async def generate(self, request: Request) -> AsyncIterator[Reply]:
        """Stream ReplicaChunks (or one Refusal); the first token is sent at once, later
        ones batched every `stream_flush_s` (each yield is a Ray object)."""
        async for item in self._flushed(request, self.engine.generate(request)):
            yield item

    async def prefill(self, request: Request, settings: dict[str, Any], token_replica: str) -> Prefilled:
        """Splitwise prompt phase (deployments.kv_handoff): the first token (None with vLLM)
        and the KvHandle for `token_replica`, or a refusal."""
        self._ensure_following_plan()
        replica = self.identity.replica_id
        try:
            first, kv = await run_prompt(self.engine, request, SplitwiseServeConfig(**settings), replica,
                                         token_replica == replica)
        except (RequestSquashed, RequestShed) as exc:
            return Prefilled(_refusal(exc), None, replica)
        if first is not None and first.finish_reason is not None:
            self._record(request, first)
        return Prefilled(None if first is None else ReplicaChunk.of(first), kv, replica)

    async def decode(self, request: Request, kv: KvHandle, timeout_s: float) -> AsyncIterator[Reply]:
        """Splitwise token phase: stream the rest of the request from the prompt replica's
        KV (recomputing the prompt if it does not arrive); the last chunk says how it came."""
        outcome: list[str] = []
        replica = self.identity.replica_id
        async for item in self._flushed(request, run_tokens(self.engine, request, kv, replica, timeout_s, outcome)):
            if isinstance(item, ReplicaChunk) and item.finish_reason is not None:
                item = replace(item, kv=outcome[0] if outcome else None, replica=replica)
            yield item

    async def _supersede(self, request_id: str) -> _Stream:
        """A stream arriving under the id of one this replica still streams: its first
        caller died (an ingress replica lost with its machine) and the gateway resumed the
        request; the orphan stops, freeing its batch slot and its id, before this one starts."""
        orphan = self._streaming.get(request_id)
        if orphan is not None:
            if orphan.task is not None and not orphan.task.done():
                orphan.task.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(orphan.ended.wait(), timeout=10.0)
        stream = self._streaming[request_id] = _Stream(asyncio.current_task())
        return stream

    async def _flushed(self, request: Request, chunks: AsyncGenerator[GenerationChunk, None]) -> AsyncIterator[Reply]:
        self._ensure_following_plan()
        stream = await self._supersede(request.request_id)
        try:
            async for reply in self._flushed_chunks(request, chunks):
                if not isinstance(reply, ReplicaChunk) or reply.finish_reason is not None:
                    await self._end(request.request_id, stream, chunks)  # before its caller stops pulling
                yield reply
                stream.task = asyncio.current_task()
        finally:
            if not stream.ended.is_set():
                await self._end(request.request_id, stream, chunks)

    async def _end(self, request_id: str, stream: _Stream, chunks: AsyncGenerator[GenerationChunk, None]) -> None:
        """The engine lets go of the request id (its stream closed), then `ended`."""
        await chunks.aclose()
        stream.ended.set()
        if self._streaming.get(request_id) is stream:
            del self._streaming[request_id]

    async def _flushed_chunks(self, request: Request, chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[Reply]:
        # Started, not made current: a generator runs in its consumer's context, and one
        # closed from another task (a superseded orphan) could not detach a current span.
        span = tracer.start_span("wattwise.replica.generate", attributes={
            "wattwise.pool": self.pool, "wattwise.length_class": request.length_class})
        held: list[GenerationChunk] = []  # since the last flush
        last_flush = 0.0
        try:
            async for chunk in chunks:
                held.append(chunk)
                now = time.monotonic()
                if chunk.finish_reason is not None:
                    self._record(request, chunk)
                    span.set_attribute("wattwise.energy_j", chunk.usage.energy_j if chunk.usage else 0.0)
                    yield ReplicaChunk.merged(held)
                    return
                if last_flush == 0.0 or now - last_flush >= self.stream_flush_s:
                    yield ReplicaChunk.merged(held)
                    held.clear()
                    last_flush = now
        except (RequestSquashed, RequestShed) as exc:
            yield self._refused(exc)
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR)
            raise
        finally:
            span.end()

    async def complete(self, request: Request) -> Reply:
        """Whole response in one reply: no per-chunk cost for non-streaming clients."""
        self._ensure_following_plan()
        chunks: list[GenerationChunk] = []
        try:
            async for chunk in self.engine.generate(request):
                chunks.append(chunk)
                if chunk.finish_reason is not None:
                    self._record(request, chunk)
                    return ReplicaChunk.merged(chunks)
        except (RequestSquashed, RequestShed) as exc:
            return self._refused(exc)
        raise RuntimeError(f"engine ended request {request.request_id} without a final chunk")

    def _refused(self, exc: RequestSquashed | RequestShed) -> Refusal:
        """The reply for a request the engine refused (squashed after waiting, or shed)."""
        refusal = _refusal(exc)
        reason = ("squashed" if isinstance(refusal, Squashed)
                  else "overflow" if isinstance(exc, RequestOverflowed) else "shed")
        self.metrics.record_refusal(reason)
        return refusal

    def _record(self, request: Request, chunk: GenerationChunk) -> None:
        if chunk.usage is not None and chunk.finish_reason is not None:  # the final chunk carries both
            self.metrics.record_request(request.length_class, request.service_class, chunk.usage, chunk.finish_reason)

    def record_autoscaling_stats(self) -> dict[str, float]:
        stats = self.engine.stats()
        # Modelled GPUs run at the engine's clock; real ones at what the actor read back.
        self.metrics.record_stats(stats, self.applied_clock_mhz if self.gpu_ids else stats.clock_mhz)
        return stats.to_metrics()

    def record_routing_stats(self) -> dict[str, Any]:
        """What the pool's request routers read (deployments.kv_router, deployments.token_router):
        counts as floats, and the prefix blocks it holds (most recent first, at most
        MAX_REPORTED_BLOCKS)."""
        stats = self.engine.stats()
        return {PENDING_TOKENS_STAT: float(stats.pending_prompt_tokens + stats.pending_decode_tokens),
                **occupancy_stats(stats.occupancy()),
                PREFIX_BLOCKS_STAT: self.engine.prefix_blocks()[:MAX_REPORTED_BLOCKS]}

    async def shutdown(self) -> None:
        """Release the GPUs' clocks, then stop the engine (Serve calls this as the replica
        stops: deployments.builder)."""
        await self._release_gpus()
        await self.engine.shutdown()


def _refusal(exc: RequestSquashed | RequestShed) -> Refusal:
    if isinstance(exc, RequestSquashed):
        return Squashed(exc.waited_s)
    return Shed(exc.reason, exc.retry_after_s)
