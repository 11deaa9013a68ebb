"""Token buckets and per-tenant limits (429 + Retry-After comes from these numbers)."""

import math

import pytest

from app.rate_limit import Lease, LeasedAllowance, TenantLimiter, TokenBucket


def test_bucket_allows_a_burst_then_asks_to_wait_then_refills() -> None:
    b = TokenBucket(rate_per_s=2.0, capacity=4.0)
    assert [b.wait_s(1, 0.0) for _ in range(4)] == [0.0] * 4
    assert b.wait_s(1, 0.0) == pytest.approx(0.5)
    assert b.wait_s(1, 0.5) == 0.0


def test_oversized_request_waits_a_full_refill() -> None:
    assert TokenBucket(rate_per_s=10.0, capacity=50.0).wait_s(80, 0.0) == pytest.approx(5.0)


def test_limits_are_per_tenant_and_count_tokens() -> None:
    limiter = TenantLimiter({"a": (None, 100.0), "b": (1.0, None)}, burst_s=2.0)
    assert limiter.retry_after_s("a", 150, 0.0) is None  # 200-token burst
    assert limiter.retry_after_s("a", 100, 0.0) == pytest.approx(0.5)
    assert limiter.retry_after_s("b", 10_000, 0.0) is None  # requests only: tokens do not count
    assert limiter.retry_after_s("b", 1, 0.0) is None
    assert limiter.retry_after_s("b", 1, 0.0) == pytest.approx(1.0)
    assert limiter.retry_after_s("unlimited", 10**9, 0.0) is None


def _admitted(limiters: list[TenantLimiter], allowances: list[LeasedAllowance] | None,
              seconds: float) -> tuple[int, int]:
    """Requests of 1 token admitted (and ledger round trips) when 100 requests/s arrive in
    turn at len(limiters) or len(allowances) ingress replicas."""
    admitted = asks = 0
    for i in range(int(seconds * 100)):
        now_s = i / 100
        if allowances is None:  # each replica its own buckets
            admitted += limiters[i % len(limiters)].retry_after_s("t", 1, now_s) is None
            continue
        allowance = allowances[i % len(allowances)]
        if allowance.take("t", 1, now_s):
            admitted += 1
        elif allowance.refused_for_s("t", now_s) is None:
            asks += 1
            lease = limiters[0].lease("t", 1, now_s, share=0.1)
            admitted += lease.retry_after_s is None
            allowance.add("t", lease, now_s)
    return admitted, asks


def test_leased_limit_holds_across_replicas_with_few_round_trips() -> None:
    limits = {"t": (10.0, 1000.0)}  # 10 requests/s, 50 of burst
    bound = 50 + 10 * 4.0  # the burst and 4 s of refill
    own_buckets, _ = _admitted([TenantLimiter(limits, 5.0) for _ in range(3)], None, 4.0)
    assert own_buckets > 1.5 * bound  # the old way: each replica its whole limit
    leased, asks = _admitted([TenantLimiter(limits, 5.0)], [LeasedAllowance() for _ in range(3)], 4.0)
    assert 0.9 * bound <= leased <= bound
    assert asks < 400 / 2  # most requests, admitted or refused, are decided without the ledger


def test_lease_grants_a_share_and_unlimited_tenants_an_unbounded_one() -> None:
    limiter = TenantLimiter({"t": (10.0, None)}, burst_s=2.0)  # 20 requests of burst
    lease = limiter.lease("t", 5, 0.0, share=0.25)
    assert lease.retry_after_s is None and lease.requests == 5.0 and lease.tokens == math.inf
    assert limiter.lease("free", 10**6, 0.0, share=0.25).requests == math.inf


def test_allowance_expires_and_a_new_lease_replaces_it() -> None:
    allowance = LeasedAllowance(ttl_s=1.0)
    allowance.add("t", Lease(requests=2, tokens=100), 0.0)
    assert allowance.take("t", 60, 0.5) and not allowance.take("t", 60, 0.5)  # tokens run out first
    allowance.add("t", Lease(requests=5, tokens=100), 0.5)
    assert allowance.take("t", 10, 1.4)
    assert not allowance.take("t", 10, 1.5)  # expired
    allowance.add("t", Lease(retry_after_s=2.0), 1.5)
    assert allowance.refused_for_s("t", 2.5) == pytest.approx(1.0) and allowance.refused_for_s("t", 3.5) is None
    assert not allowance.take("t", 1, 2.5)
