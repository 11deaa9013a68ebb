"""Prefix blocks and the LRU a replica holds them in (core.prefix_cache), and the rank that
routes by them within a load bound (core.replica_choice.PrefixAffinity)."""

from __future__ import annotations

from core.prefix_cache import PrefixCache, block_hashes, chained
from core.replica_choice import PrefixAffinity, ReplicaOccupancy, rank_replicas


def test_equal_hashes_mean_equal_prefixes_up_to_there() -> None:
    a, b = list(range(100)), list(range(64)) + [7] * 36
    ha, hb = block_hashes(a, 32), block_hashes(b, 32)
    assert len(ha) == 3 and len(block_hashes(a[:95], 32)) == 2  # full blocks only
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # A block equal in content but after a different prefix is another block.
    assert block_hashes([1] * 32 + [5] * 32, 32)[1] != block_hashes([2] * 32 + [5] * 32, 32)[1]
    assert chained([9, 8])[0] == chained([9, 7])[0] and chained([1, 8])[1] != chained([2, 8])[1]


def test_the_cache_matches_a_prompts_first_blocks_and_evicts_the_least_recently_used() -> None:
    cache = PrefixCache(capacity_blocks=4)
    cache.use((1, 2, 3))
    assert cache.matched((1, 2, 9, 3)) == 2 and cache.matched((5, 1)) == 0
    cache.use((1,))  # used again: most recent
    cache.use((7, 8))  # one over capacity: 2, the least recently used, goes
    assert cache.held() == [8, 7, 1, 3] and cache.matched((1, 2)) == 1


def _replica(requests: int, cached: float, kv_used: float = 0.0) -> ReplicaOccupancy:
    return ReplicaOccupancy(requests, 0.0, kv_used, 50_000, cached_prompt_tokens=cached)


def test_prefix_affinity_wins_within_the_load_bound_and_never_beyond() -> None:
    affinity = PrefixAffinity(imbalance_requests=4, min_match=0.1)
    idle, holder = _replica(0, 0), _replica(3, 1_500)
    assert rank_replicas([idle, holder], 2_000) == [0, 1]  # without affinity: the emptier
    assert rank_replicas([idle, holder], 2_000, affinity=affinity) == [1, 0]
    busy_holder = _replica(5, 1_500)  # 5 more requests than the least loaded: past the bound
    assert rank_replicas([idle, busy_holder], 2_000, affinity=affinity) == [0, 1]
    small = _replica(1, 100)  # holds 5% of the prompt: under min_match
    assert rank_replicas([idle, small], 2_000, affinity=affinity) == [0, 1]
    full = _replica(0, 2_000, kv_used=49_000)  # no room for the prompt: affinity does not apply
    assert rank_replicas([idle, full], 2_000, affinity=affinity) == [0, 1]
    assert rank_replicas([idle, _replica(0, 500), holder], 2_000, affinity=affinity)[0] == 2  # most cached first
    assert rank_replicas([idle, busy_holder], 2_000, affinity=PrefixAffinity.unbounded()) == [1, 0]
