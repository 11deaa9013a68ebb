"""Overflow between length pools: the attempts both runtimes walk for a request."""

from __future__ import annotations

from app.pool_overflow import Attempt, PoolOverflowConfig, overflow_attempts, serving_pools

CONFIG = PoolOverflowConfig(backed_up_tokens=1000)
ORDER = ["pool-short", "pool-medium", "pool-long"]


def test_a_backed_up_pool_tries_the_others_with_room_in_order_then_queues_at_home() -> None:
    assert overflow_attempts("pool-long", "interactive", ORDER, CONFIG) == [
        Attempt("pool-long", 1000), Attempt("pool-short", 500), Attempt("pool-medium", 500),
        Attempt("pool-long", None)]


def test_batch_work_and_a_lone_pool_queue_where_they_are_sent() -> None:
    assert overflow_attempts("pool-long", "batch", ORDER, CONFIG) == [Attempt("pool-long", None)]
    assert overflow_attempts("pool-long", "interactive", ["pool-long"], CONFIG) == [Attempt("pool-long", None)]
    off = PoolOverflowConfig(enabled=False)
    assert overflow_attempts("pool-long", "interactive", ORDER, off) == [Attempt("pool-long", None)]
    assert overflow_attempts("pool-long", "interactive", ORDER, None) == [Attempt("pool-long", None)]


def test_only_pools_routing_sends_a_class_to_serve() -> None:
    # Conversation at low load: the short and medium pools folded into the long one.
    folded = {"SS": {"pool-long": 1.0}, "MM": {"pool-long": 1.0, "pool-medium": 0.0}}
    assert serving_pools(folded, ORDER) == ["pool-long"]
    split = {"SS": {"pool-short": 1.0}, "LL": {"pool-long": 0.7, "pool-medium": 0.3}}
    assert serving_pools(split, ORDER) == ORDER
    assert serving_pools({}, ORDER) == []
