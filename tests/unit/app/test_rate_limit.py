"""Token buckets and per-tenant limits (429 + Retry-After comes from these numbers)."""

import pytest

from app.rate_limit import TenantLimiter, TokenBucket


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
