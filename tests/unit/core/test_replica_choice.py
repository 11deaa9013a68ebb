"""The rank both runtimes route a pool's requests by (core.replica_choice)."""

from __future__ import annotations

import math

from core.replica_choice import ReplicaOccupancy, rank_replicas
from core.stats import ReplicaStats


def _replica(requests: int, kv_tokens_used: float, kv_tokens_total: float = 50_000,
             pending_prompt_tokens: float = 0.0) -> ReplicaOccupancy:
    return ReplicaOccupancy(requests, pending_prompt_tokens, kv_tokens_used, kv_tokens_total)


def test_a_prompt_goes_to_a_replica_with_room_before_a_shorter_queue_whose_kv_is_full() -> None:
    full, roomy = _replica(3, 48_000), _replica(9, 30_000)
    assert rank_replicas([full, roomy], prompt_tokens=1_000) == [1, 0]
    # Past the headroom counts as full: 39,000 + 1,000 tokens is 0.8 of the cache, 39,001 is over.
    edge, over = _replica(1, 39_000), _replica(1, 39_001)
    assert rank_replicas([over, roomy, edge], prompt_tokens=1_000) == [2, 1, 0]


def test_among_replicas_with_room_the_least_prompt_work_ahead_wins_then_the_shortest_queue() -> None:
    backlog = _replica(2, 10_000, pending_prompt_tokens=4_000)
    busy, idle = _replica(6, 20_000), _replica(3, 20_000)
    assert rank_replicas([backlog, busy, idle], prompt_tokens=500) == [2, 1, 0]
    assert rank_replicas([_replica(2, 0), _replica(2, 0)], prompt_tokens=100) == [0, 1]  # ties keep their order


def test_with_no_replica_room_the_rank_still_orders_them_and_an_unreported_replica_has_room() -> None:
    full = [_replica(4, 50_000), _replica(2, 50_000)]
    assert rank_replicas(full, prompt_tokens=100) == [1, 0]
    unreported = _replica(5, 0.0, kv_tokens_total=math.inf)
    assert rank_replicas([full[1], unreported], prompt_tokens=100) == [1, 0]


def test_a_replicas_stats_carry_its_occupancy_prompts_to_prefill_included() -> None:
    stats = ReplicaStats(queued_requests=2, running_requests=5, kv_blocks_used=100, kv_blocks_total=400,
                         kv_block_size=16, pending_prompt_tokens=300)
    assert stats.occupancy() == ReplicaOccupancy(7, 300, 100 * 16 + 300, 400 * 16)
