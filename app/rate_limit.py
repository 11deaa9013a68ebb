"""Per-tenant rate limits: token buckets on requests and on tokens (prompt + max_tokens).

A refused request gets the time until its bucket refills, which the ingress returns as
429 + Retry-After. A limit holds for the whole app, however many ingress replicas serve
it: the buckets live in one place (deployments.rate_ledger), and each replica leases
from them. A lease takes the request's own amounts plus a small share of each bucket
(`Lease`), which the replica spends locally (`LeasedAllowance`) before it asks again, so
most requests cost no round trip and none can take more than the buckets hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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

    def take_up_to(self, amount: float, now_s: float, whole: bool = False) -> float:
        """Take as much of `amount` as the bucket holds now (`whole`: in whole units);
        returns what was taken."""
        self.shortfall_s(0.0, now_s)  # refill to now
        taken = min(max(self.level, 0.0), amount)
        if whole:
            taken = math.floor(taken)
        self.level -= taken
        return taken

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

    def lease(self, tenant: str, tokens: int, now_s: float, share: float) -> Lease:
        """Admit one request of `tokens` (as retry_after_s) and grant, on top, up to `share`
        of each of the tenant's buckets for the asker to admit without asking again."""
        wait_s = self.retry_after_s(tenant, tokens, now_s)
        if wait_s is not None:
            return Lease(retry_after_s=wait_s)
        # Whole requests only: a fraction of one could never be spent.
        extra = {counts_tokens: bucket.take_up_to(share * bucket.capacity, now_s, whole=not counts_tokens)
                 for bucket, counts_tokens in self._buckets.get(tenant, [])}
        return Lease(requests=extra.get(False, math.inf), tokens=extra.get(True, math.inf))


@dataclass(frozen=True)
class Lease:
    """The ledger's answer to an ingress replica's request: refused (`retry_after_s`), or
    admitted with `requests` and `tokens` more that the replica may admit on its own
    (infinite where the tenant has no such limit)."""

    retry_after_s: float | None = None
    requests: float = 0.0
    tokens: float = 0.0


@dataclass
class _Allowance:
    requests: float = 0.0
    tokens: float = 0.0
    expires_s: float = 0.0
    refused_until_s: float = 0.0


@dataclass
class LeasedAllowance:
    """What one ingress replica may decide per tenant without asking the ledger: admit from
    the extras of its last lease, until `ttl_s` after the grant (an idle replica's leftovers
    do not add to a later burst: the buckets alone bound that), and refuse until a refusal's
    Retry-After has passed (a tenant over its limit costs no round trip per request)."""

    ttl_s: float = 1.0
    _by_tenant: dict[str, _Allowance] = field(default_factory=dict)

    def take(self, tenant: str, tokens: int, now_s: float) -> bool:
        """Admit one request of `tokens` from the allowance (True, and charged) if it covers it."""
        allowance = self._by_tenant.get(tenant)
        if allowance is None or now_s >= allowance.expires_s or allowance.requests < 1 or allowance.tokens < tokens:
            return False
        allowance.requests -= 1
        allowance.tokens -= tokens
        return True

    def refused_for_s(self, tenant: str, now_s: float) -> float | None:
        """Seconds left of the tenant's last refusal, None if none holds."""
        allowance = self._by_tenant.get(tenant)
        return allowance.refused_until_s - now_s if allowance and now_s < allowance.refused_until_s else None

    def add(self, tenant: str, lease: Lease, now_s: float) -> None:
        """Keep a lease: a grant's extras (replacing what is left of an older one), or a refusal."""
        if lease.retry_after_s is not None:
            self._by_tenant[tenant] = _Allowance(refused_until_s=now_s + lease.retry_after_s)
        else:
            self._by_tenant[tenant] = _Allowance(lease.requests, lease.tokens, now_s + self.ttl_s)
