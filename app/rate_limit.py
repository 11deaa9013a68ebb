"""Per-tenant rate limits: token buckets on requests and on tokens (prompt + max_tokens).

A refused request gets the time until its bucket refills, which the ingress returns as
429 + Retry-After. Buckets live in each ingress replica: with N ingress replicas a
tenant can get up to N times its limit, so limits are set per replica.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate_per_s: float
    capacity: float
    level: float = -1.0  # full on first use
    updated_s: float = 0.0

    def shortfall_s(self, amount: float, now_s: float) -> float:
        """0 if `amount` could be taken now, else seconds until it could (takes nothing)."""
        if self.level < 0:
            self.level, self.updated_s = self.capacity, now_s
        self.level = min(self.capacity, self.level + (now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        if amount <= self.level:
            return 0.0
        if amount > self.capacity:  # never fits: as long as a full refill
            return self.capacity / self.rate_per_s
        return (amount - self.level) / self.rate_per_s

    def wait_s(self, amount: float, now_s: float) -> float:
        """0 if `amount` can be taken now (and takes it), else seconds until it could."""
        wait = self.shortfall_s(amount, now_s)
        if wait == 0:
            self.level -= amount
        return wait


class TenantLimiter:
    """Request and token buckets per tenant; tenants without limits pass."""

    def __init__(self, limits: dict[str, tuple[float | None, float | None]], burst_s: float) -> None:
        self._buckets: dict[str, list[tuple[TokenBucket, bool]]] = {}
        for tenant, (requests_per_s, tokens_per_s) in limits.items():
            buckets = []
            if requests_per_s:
                buckets.append((TokenBucket(requests_per_s, max(requests_per_s * burst_s, 1.0)), False))
            if tokens_per_s:
                buckets.append((TokenBucket(tokens_per_s, tokens_per_s * burst_s), True))
            self._buckets[tenant] = buckets

    def retry_after_s(self, tenant: str, tokens: int, now_s: float) -> float | None:
        """None if the request may go ahead (and it is charged to every bucket); else how
        long the client should wait. A refused request is charged to no bucket."""
        buckets = [(bucket, tokens if counts_tokens else 1) for bucket, counts_tokens in self._buckets.get(tenant, [])]
        wait = max((bucket.shortfall_s(amount, now_s) for bucket, amount in buckets), default=0.0)
        if wait > 0:
            return wait
        for bucket, amount in buckets:
            bucket.wait_s(amount, now_s)
        return None
