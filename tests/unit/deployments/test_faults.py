"""Faults, overload and fail static, without a cluster: the continuation/retry logic, the
replica's queue bounds and the adapter's fail-static on their own (tests/ray/test_faults.py
injects the faults into a running app)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray.exceptions import ActorDiedError
from ray.serve.config import AutoscalingContext
from ray.serve.exceptions import RequestCancelledError

from batching.continuous_batcher import BatcherConfig, ContinuousBatcher, RequestOverflowed, RequestShed
from core.request import Request
from core.slo import SLO
from deployments.messages import ReplicaChunk
from deployments.resume import (
    Progress,
    ResumableStream,
    call_with_retries,
    continuation,
)
from deployments.serve_adapter import AppAutoscalingPolicy
from energy.calibration import default_perf_model
from engines.modelled_engine import ModelledEngine, placeholder_text
from engines.modelled_engine_config import ModelledEngineConfig
from engines.protocol import RESUME_OFFSET_KEY
from tests.factories import autoscaling_context, by_deployment


def _request(rid: str = "r1", prompt: int = 10, max_tokens: int = 20, target: int | None = None,
             ttft_s: float = 10.0) -> Request:
    return Request(rid, prompt, max_tokens, arrival_s=time.time(), slo=SLO(ttft_s=ttft_s, tbt_s=0.2),
                   target_output_tokens=target, prompt_text="hello world")


# ---- pure: the continuation and retry logic ----------------------------------------
def test_continuation_asks_only_for_the_rest() -> None:
    req = _request(prompt=10, max_tokens=20, target=15)
    progress = Progress(arrival_s=req.arrival_s)
    assert continuation(req, progress, 1.0) is req  # nothing sent yet: start over
    progress.add(ReplicaChunk(" a b c d e f", 6), 1.0)
    rest = continuation(req, progress, 2.0)
    assert (rest.prompt_tokens, rest.max_tokens, rest.target_output_tokens) == (16, 14, 9)
    assert rest.prompt_text == "hello world a b c d e f" and rest.metadata[RESUME_OFFSET_KEY] == "6"
    assert rest.request_id == req.request_id and rest.arrival_s == 2.0
    progress.add(ReplicaChunk(" g" * 9, 9), 3.0)
    assert continuation(req, progress, 4.0) is None  # the target was reached: only the ending was lost


def _replica_stream(engine: ModelledEngine, request: Request,
                    fail_after_chunks: int | None) -> AsyncIterator[ReplicaChunk]:
    """What LLMReplica.generate yields, dying like a killed actor after some chunks."""
    async def gen() -> AsyncIterator[ReplicaChunk]:
        chunks = 0
        async for c in engine.generate(request):
            if fail_after_chunks is not None and chunks == fail_after_chunks:
                raise ActorDiedError()
            chunks += 1
            yield ReplicaChunk.of(c)
    return gen()


def test_a_stream_resumed_on_another_replica_equals_the_uninterrupted_one() -> None:
    async def main() -> tuple[str, ReplicaChunk, ResumableStream, list[tuple[str, int]]]:
        engines = {"pool-a": ModelledEngine(ModelledEngineConfig(tensor_parallel=8)),
                   "pool-b": ModelledEngine(ModelledEngineConfig(tensor_parallel=8))}
        starts: list[tuple[str, int]] = []

        def start(request: Request, pool: str) -> AsyncIterator[ReplicaChunk]:
            starts.append((pool, request.max_tokens))
            return _replica_stream(engines[pool], request, fail_after_chunks=3 if len(starts) == 1 else None)

        stream = ResumableStream(start, _request("resume-me", max_tokens=40), ["pool-a", "pool-b"], max_retries=2)
        text, final = "", ReplicaChunk("", 0)
        async for chunk in stream:
            assert isinstance(chunk, ReplicaChunk)
            text += chunk.text
            if chunk.finish_reason:
                final = chunk
                break
        for engine in engines.values():
            await engine.shutdown()
        return text, final, stream, starts

    text, final, stream, starts = asyncio.run(main())
    assert text == placeholder_text("resume-me", 0, 40)  # no token missing, none repeated
    assert final.usage is not None and (final.usage.completion_tokens, final.usage.prompt_tokens) == (40, 10)
    assert stream.retries == 1 and starts[0] == ("pool-a", 40)
    assert starts[1][0] == "pool-b" and starts[1][1] < 40  # the fallback pool, for the rest only


class _Dead:
    """A stream that fails at once, like a call to a replica that just died."""

    def __init__(self, exc: BaseException) -> None:
        self.exc, self.cancelled = exc, False

    async def __anext__(self) -> dict:
        raise self.exc

    def cancel(self) -> None:
        self.cancelled = True


def test_retries_are_bounded_then_the_failure_surfaces() -> None:
    retried: list[str] = []
    stream = ResumableStream(lambda r, p: _Dead(ActorDiedError()), _request(), ["pool-a"], max_retries=2,
                             on_retry=retried.append)
    with pytest.raises(ActorDiedError):
        asyncio.run(stream.__anext__())
    assert retried == ["pool-a", "pool-a"]


def test_a_cancelled_request_is_not_retried() -> None:
    stream = ResumableStream(lambda r, p: _Dead(RequestCancelledError("x")), _request(), ["pool-a"], max_retries=2)
    with pytest.raises(RequestCancelledError):
        asyncio.run(stream.__anext__())
    assert stream.retries == 0


def test_non_streaming_calls_start_over_on_the_next_pool() -> None:
    calls: list[str] = []

    async def call(pool: str) -> dict:
        calls.append(pool)
        if len(calls) == 1:
            raise ActorDiedError()
        return {"text": "ok"}

    assert asyncio.run(call_with_retries(call, ["pool-a", "pool-b"], max_retries=1)) == {"text": "ok"}
    assert calls == ["pool-a", "pool-b"]


# ---- pure: bounded replica queues and shedding ---------------------------------------
def _batcher(**config: Any) -> ContinuousBatcher:
    return ContinuousBatcher(default_perf_model("llama2-70b", "h100-80gb"), BatcherConfig(**config))


def test_the_replica_queue_is_bounded() -> None:
    batcher = _batcher(max_waiting=2)
    batcher.add(_request("a"), 0.0)
    batcher.add(_request("b"), 0.0)
    with pytest.raises(RequestShed, match="2 requests already wait") as shed:
        batcher.add(_request("c"), 0.0)
    assert shed.value.retry_after_s >= 1 and "c" not in batcher.by_id


def test_requests_are_shed_before_the_queue_makes_them_late() -> None:
    batcher = _batcher(shed_wait_factor=4.0)
    first = _request("a", ttft_s=0.25)
    batcher.add(first, first.arrival_s)
    batcher.add(_request("b", ttft_s=0.25), first.arrival_s + 0.5)  # head waited 0.5 s <= 4 x 0.25 s
    late = _request("c", ttft_s=0.25)
    with pytest.raises(RequestShed, match="queue wait") as shed:
        batcher.add(late, first.arrival_s + 3.0)  # the head has waited 3 s: c would wait at least as long
    assert 1 <= shed.value.retry_after_s <= 30
    batcher.add(_request("d", ttft_s=30.0), first.arrival_s + 3.0)  # a looser target still fits


def test_a_backed_up_replica_refuses_what_its_router_may_send_elsewhere() -> None:
    """Overflow between pools (app.pool_overflow): the limit is the prompt tokens the
    replica still has to prefill; a refused request leaves no trace, one without a limit queues."""
    batcher = _batcher()
    batcher.add(_request("a", prompt=3000), 0.0)
    batcher.add(_request("b", prompt=2000), 0.0)
    overflowable = _request("c", prompt=10)
    overflowable.refuse_above_pending_tokens = 4999
    with pytest.raises(RequestOverflowed, match="5000 prompt tokens to prefill > 4999"):
        batcher.add(overflowable, 0.0)
    assert "c" not in batcher.by_id and batcher.stats(0.0).class_rates_per_s == {"MM": 2 / 30}
    overflowable.refuse_above_pending_tokens = 5000
    batcher.add(overflowable, 0.0)  # not over the limit: taken
    last = _request("d", prompt=10)
    batcher.add(last, 0.0)  # no limit: queues however backed up the replica is
    assert batcher.pending_prompt_tokens == 5020


def test_time_spent_before_the_replica_does_not_count_as_its_queue() -> None:
    """Requests that waited in Serve's router for a pool scaling up from 0 reach the new
    replica together, late; its queue is fresh, so none is shed."""
    batcher = _batcher(shed_wait_factor=4.0)
    burst = [_request(str(i), ttft_s=0.25) for i in range(6)]
    reached_s = burst[0].arrival_s + 4.5  # 18 x the TTFT target after arriving at the ingress
    for request in burst:
        batcher.add(request, reached_s)
    assert len(batcher.waiting) == 6


# ---- pure: the autoscaling adapter fails static -------------------------------------
def _ctx(replicas: int, metrics: dict, now_s: float) -> AutoscalingContext:
    """pool-a's context: every replica reports `metrics`; nothing counted outside them."""
    return autoscaling_context("pool-a", replicas, metrics, total_requests=0.0, now_s=now_s)


def test_stale_stats_keep_the_last_targets_and_say_so() -> None:
    policy = AppAutoscalingPolicy(policy="utilisation", stale_after_s=10.0, target_requests_per_replica=1)
    busy = {"running_requests": 10.0, "kv_blocks_total": 100.0}
    decisions, state = policy(by_deployment(_ctx(2, busy, 0.0)))
    assert list(decisions.values()) == [5] and not next(iter(state.values()))["fail_static"]
    for now in (1.0, 5.0):  # stats missing, but not for long yet: the policy still decides
        decisions, state = policy(by_deployment(_ctx(2, {}, now)))
        assert not next(iter(state.values()))["fail_static"]
    decisions, state = policy(by_deployment(_ctx(3, {}, 12.0)))
    assert list(decisions.values()) == [3]  # kept the current target
    assert next(iter(state.values()))["fail_static_reason"] == "stale_stats" and policy.failures == 1
    decisions, state = policy(by_deployment(_ctx(3, busy, 13.0)))
    assert not next(iter(state.values()))["fail_static"] and policy.fail_static_reason is None
