"""The pools' default request router (deployments.kv_router) over replicas as Serve hands
them to it: their routing stats, as the replicas last reported them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from core.replica_choice import ReplicaOccupancy
from deployments.kv_router import (
    PREFIX_BLOCKS_STAT,
    REQUESTS_STAT,
    STATS_PERIOD_S,
    KvAwareRouter,
    PrefixAwareRouter,
    occupancy_stats,
)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _router(clock: _Clock | None = None) -> KvAwareRouter:
    router = KvAwareRouter.__new__(KvAwareRouter)  # Serve builds it with a handle's internals
    router.initialize_state(now_s=clock or _Clock())
    return router


def _replica(name: str, requests: int = 0, kv_tokens_used: float = 0.0, kv_tokens_total: float = 50_000,
             reported: bool = True) -> Any:
    stats = occupancy_stats(ReplicaOccupancy(requests, 0.0, kv_tokens_used, kv_tokens_total)) if reported else {}
    return SimpleNamespace(replica_id=name, routing_stats=stats)


def _pending(request_id: str, prompt_tokens: int) -> Any:
    return SimpleNamespace(args=[SimpleNamespace(prompt_tokens=prompt_tokens)],
                           metadata=SimpleNamespace(internal_request_id=request_id))


def _first(router: KvAwareRouter, replicas: list[Any], request_id: str, prompt_tokens: int = 100) -> str:
    ranks = asyncio.run(router.choose_replicas(replicas, _pending(request_id, prompt_tokens)))
    return str(ranks[0][0].replica_id)


def test_a_prompt_skips_the_shorter_queue_whose_kv_cache_is_full() -> None:
    replicas = [_replica("full", 2, 49_000), _replica("roomy", 8, 10_000)]
    assert _first(_router(), replicas, "r1", prompt_tokens=1_000) == "roomy"


def test_a_burst_between_two_reports_spreads_over_the_replicas() -> None:
    router = _router()
    replicas = [_replica("a"), _replica("b")]
    chosen = [_first(router, replicas, f"r{i}") for i in range(4)]
    assert sorted(chosen) == ["a", "a", "b", "b"]  # counted as sent, not all on the stale "empty" replica


def test_what_it_sent_counts_until_a_report_can_hold_it_and_its_requests_until_they_complete() -> None:
    clock = _Clock()
    router = _router(clock)
    replicas = [_replica("a", kv_tokens_total=10_000), _replica("b", requests=3, kv_tokens_total=10_000)]
    assert _first(router, replicas, "long", prompt_tokens=7_900) == "a"
    assert _first(router, replicas, "next", prompt_tokens=500) == "b"  # a: 7,900 + 500 > 0.8 x 10,000
    clock.now_s = 2.0  # a report since holds what was sent (here: a is empty again), b's 3 requests remain
    assert _first(router, replicas, "third", prompt_tokens=500) == "a"
    router.on_request_completed("b", "next")
    router.on_request_completed("a", "long")
    router.on_request_completed("a", "third")
    assert router._requests["a"] == 0 and router._requests["b"] == 0


def test_a_replica_with_no_report_yet_has_room() -> None:
    replicas = [_replica("new", reported=False), _replica("old", 1, 9_500, 10_000)]
    assert _first(_router(), replicas, "r1") == "new"


def test_a_sim_replica_reports_its_occupancy_as_flat_floats_and_its_prefix_blocks() -> None:
    """What Serve carries from LLMReplica.record_routing_stats to the routers."""
    from deployments.replica import LLMReplica, ReplicaIdentity
    from engines.modelled_engine import ModelledEngine
    from engines.modelled_engine_config import ModelledEngineConfig

    engine = ModelledEngine(ModelledEngineConfig(prefix_block_tokens=512))
    replica = LLMReplica("short", engine, ReplicaIdentity("app", "pool-short", "r0"))
    engine.batcher.prefix_cache.use((4, 5))  # type: ignore[union-attr]
    stats = replica.record_routing_stats()
    assert all(type(v) is float for k, v in stats.items() if k != PREFIX_BLOCKS_STAT)
    assert stats["requests"] == 0.0 and stats["kv_tokens_total"] > 0 and stats[PREFIX_BLOCKS_STAT] == [5, 4]


def _prefix_router(clock: _Clock) -> PrefixAwareRouter:
    router = PrefixAwareRouter.__new__(PrefixAwareRouter)
    router.initialize_state(now_s=clock, block_tokens=512, imbalance_requests=4, min_match=0.1)
    return router


def _prefixed(request_id: str, prefix: tuple[int, ...]) -> Any:
    return SimpleNamespace(args=[SimpleNamespace(prompt_tokens=512 * len(prefix) + 100, prefix_hashes=prefix)],
                           metadata=SimpleNamespace(internal_request_id=request_id))


def test_a_prompt_goes_where_its_prefix_is_reported_or_was_just_sent_within_the_load_bound() -> None:
    clock = _Clock()
    router = _prefix_router(clock)
    holder, other = _replica("holder", requests=2), _replica("other")
    holder.routing_stats[PREFIX_BLOCKS_STAT] = [3, 2, 1]  # most recent first
    chosen = asyncio.run(router.choose_replicas([other, holder], _prefixed("t1", (1, 2, 3, 4))))
    assert chosen[0][0].replica_id == "holder"  # 3 of 4 blocks there, 2 requests above the least loaded
    # A new conversation lands by load; its next turn follows it before any report names it.
    first = asyncio.run(router.choose_replicas([other, holder], _prefixed("c1", (50, 51))))[0][0].replica_id
    router.on_request_completed(first, "c1")
    again = asyncio.run(router.choose_replicas([holder, other], _prefixed("c2", (50, 51, 52))))[0][0].replica_id
    assert first == again == "other"
    clock.now_s += 2 * STATS_PERIOD_S  # the prompts sent are in the reports by now
    holder.routing_stats[REQUESTS_STAT] = 9.0  # past the bound: load wins over its prefix
    assert asyncio.run(router.choose_replicas([other, holder], _prefixed("t2", (1, 2, 3))))[0][0].replica_id == "other"
