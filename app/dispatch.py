"""Token-balanced dispatch of queries across clusters (Mico §3.3), and its baselines.

Round-robin balances how many queries each cluster gets; their cost is tokens (prompt +
response, which also sizes the KV cache), so Mico balances per-cluster token sums M_k
instead: group queries by predicted length, hand out the longest groups first, one
round of clusters at a time, the longest query of a round to the least-loaded cluster;
a round that empties its group borrows from the next group, the borrowed queries going
round-robin. Weights (integer capacity units: GPUs, replicas) make a cluster's share
proportional to its capacity. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Query:
    """A query to place: its predicted bucket and the token cost that bucket implies."""

    request_id: str
    prompt_tokens: int
    bucket: int
    predicted_output_tokens: int

    @property
    def cost_tokens(self) -> int:
        return self.prompt_tokens + self.predicted_output_tokens


def _check(weights: Sequence[int]) -> None:
    if not weights or any(w < 1 or int(w) != w for w in weights):
        raise ValueError(f"weights must be positive integers (capacity units), got {list(weights)}")


def longest_first(queries: Sequence[Query]) -> list[int]:
    """Query indices grouped by bucket, longest bucket first; counting sort, O(n + buckets)."""
    n_buckets = max((q.bucket for q in queries), default=-1) + 1
    groups: list[list[int]] = [[] for _ in range(n_buckets)]
    for i, q in enumerate(queries):
        groups[q.bucket].append(i)
    return [i for group in reversed(groups) for i in group]


def token_balanced(
    queries: Sequence[Query], weights: Sequence[int], loads_tokens: Sequence[float] | None = None
) -> list[int]:
    """Cluster index of each query; `loads_tokens` are the clusters' M_k before this batch.

    O(n log R) for rounds of R = sum(weights) slots: O(n) for a fixed set of clusters."""
    _check(weights)
    k_n = len(weights)
    load = list(loads_tokens) if loads_tokens is not None else [0.0] * k_n
    out = [-1] * len(queries)
    stream = longest_first(queries)
    round_size = sum(weights)
    cursor = 0  # round-robin position for borrowed queries, kept across rounds
    for start in range(0, len(stream), round_size):
        members = stream[start:start + round_size]
        group = queries[members[0]].bucket
        own = sorted((i for i in members if queries[i].bucket == group), key=lambda i: -queries[i].cost_tokens)
        borrowed = [i for i in members if queries[i].bucket != group]
        quota = list(weights)
        for i in own:
            k = min((k for k in range(k_n) if quota[k]), key=lambda k: (load[k] / weights[k], (k - cursor) % k_n))
            out[i] = k
            quota[k] -= 1
            load[k] += queries[i].cost_tokens
        for i in borrowed:
            while not quota[cursor]:
                cursor = (cursor + 1) % k_n
            out[i] = cursor
            quota[cursor] -= 1
            load[cursor] += queries[i].cost_tokens
            cursor = (cursor + 1) % k_n
    return out


def round_robin(n_queries: int, weights: Sequence[int], start: int = 0) -> list[int]:
    """Count-balanced baseline (Mico's Q-bar): clusters in turn, `weights[k]` slots each per round."""
    _check(weights)
    slots = [k for k, w in enumerate(weights) for _ in range(w)]
    return [slots[(start + i) % len(slots)] for i in range(n_queries)]


def rank_by_load(loads_tokens: Sequence[float], weights: Sequence[float], cost_tokens: float) -> list[int]:
    """Clusters best first for one arriving query: least (M_k + cost) / weight (online form)."""
    return sorted(range(len(loads_tokens)), key=lambda k: ((loads_tokens[k] + cost_tokens) / weights[k], k))
