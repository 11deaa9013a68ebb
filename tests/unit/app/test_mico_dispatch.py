"""Mico §3.3: token-balanced dispatch vs count-balanced round-robin, borrowing, weights."""

import numpy as np
import pytest

from app.dispatch import Query, longest_first, rank_by_load, round_robin, token_balanced
from prediction.length_buckets import LengthBuckets
from sim.multicluster import ClusterSpec, MultiClusterSim

BUCKETS = LengthBuckets.uniform(700, 10)


def _queries(outputs: list[int], prompt_tokens: int = 20) -> list[Query]:
    return [Query(str(i), prompt_tokens, BUCKETS.label(o), BUCKETS.midpoint_tokens(BUCKETS.label(o)))
            for i, o in enumerate(outputs)]


def _loads(queries: list[Query], assignment: list[int], k: int) -> np.ndarray:
    loads = np.zeros(k)
    for q, c in zip(queries, assignment):
        loads[c] += q.cost_tokens
    return loads


def test_skewed_stream_balanced_where_round_robin_is_not() -> None:
    """Every third query is long: round-robin puts them all on one cluster."""
    outputs = [650 if i % 3 == 0 else 30 for i in range(300)]
    queries = _queries(outputs)
    rr = _loads(queries, round_robin(300, [1, 1, 1]), 3)
    tb = _loads(queries, token_balanced(queries, [1, 1, 1]), 3)
    assert rr.max() / rr.min() > 5
    assert tb.max() / tb.min() < 1.05
    assert tb.max() - tb.min() <= max(q.cost_tokens for q in queries)


def test_random_heavy_tail_stays_within_one_query() -> None:
    rng = np.random.default_rng(1)
    queries = _queries(list(rng.lognormal(4.5, 1.0, 500).astype(int) + 1))
    loads = _loads(queries, token_balanced(queries, [1] * 6), 6)
    assert loads.max() - loads.min() <= max(q.cost_tokens for q in queries)


def test_groups_go_longest_first() -> None:
    queries = _queries([30, 650, 300, 650, 100])
    assert [queries[i].bucket for i in longest_first(queries)] == [9, 9, 4, 1, 0]


def test_partial_group_borrows_from_the_next_group_round_robin() -> None:
    """5 long on 3 clusters: round 2 holds 2 long + 1 borrowed; the borrowed go round-robin."""
    queries = _queries([650] * 5 + [300] * 4)
    out = token_balanced(queries, [1, 1, 1])
    long_clusters = [out[i] for i in range(5)]
    assert sorted(np.bincount(long_clusters, minlength=3)) == [1, 2, 2]
    first_borrowed = out[5]
    assert long_clusters.count(first_borrowed) == 1  # it completes the cluster that got fewer long ones
    assert np.bincount(out, minlength=3).tolist() == [3, 3, 3]
    # A second partial round (one long left) borrows two, to the two other clusters.
    queries = _queries([650] * 4 + [300] * 5)
    out = token_balanced(queries, [1, 1, 1])
    borrowed = [out[i] for i in range(4, 6)]
    assert len(set(borrowed)) == 2 and out[3] not in borrowed


def test_weights_give_proportional_tokens() -> None:
    rng = np.random.default_rng(2)
    queries = _queries(list(rng.integers(1, 700, 600)))
    loads = _loads(queries, token_balanced(queries, [2, 1]), 2)
    assert loads[0] / loads.sum() == pytest.approx(2 / 3, abs=0.02)
    assert np.bincount(round_robin(600, [2, 1])).tolist() == [400, 200]


def test_existing_load_is_counted() -> None:
    queries = _queries([300] * 4)
    out = token_balanced(queries, [1, 1], loads_tokens=[10_000, 0])
    assert out.count(1) == 2  # per-round quotas keep counts even; the long ones fill cluster 1 first


def test_bad_weights_rejected() -> None:
    with pytest.raises(ValueError):
        token_balanced(_queries([10]), [1, 0])
    with pytest.raises(ValueError):
        round_robin(3, [1.5])


def test_rank_by_load_prefers_least_pending_tokens_per_capacity() -> None:
    assert rank_by_load([500, 100, 300], [1, 1, 1], 50) == [1, 2, 0]
    assert rank_by_load([500, 300], [4, 1], 50)[0] == 0


def test_token_balanced_raises_throughput_on_skewed_lengths() -> None:
    """Mico's experiment, small: 3 clusters, batch 3, 200 queries, oracle buckets."""
    outputs = [650 if i % 3 == 0 else 30 for i in range(200)]
    queries = _queries(outputs)
    prompts = [q.prompt_tokens for q in queries]
    predicted = [q.predicted_output_tokens for q in queries]

    def run(assignment):
        return MultiClusterSim(ClusterSpec(batch_limit=3), 3, prompts, outputs, predicted).run(assignment)

    rr, tb = run(round_robin(200, [1, 1, 1])), run(token_balanced(queries, [1, 1, 1]))
    assert tb.throughput_qps > 1.5 * rr.throughput_qps
    assert tb.token_imbalance < 1.1 < rr.token_imbalance
