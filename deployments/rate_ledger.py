"""The app's rate-limit buckets in one place, so a tenant's limit holds however many
ingress replicas serve it (app.rate_limit: each replica leases from these buckets).

A named, detached actor like the plan store: Ray restarts it elsewhere when its node dies
(max_restarts=-1). A restarted ledger starts with full buckets, so a tenant may burst once
more; nothing else is lost. While the ledger cannot be reached, each ingress replica
limits on its own at its share of every limit (limit / ingress replicas), logs it, and
counts it in `wattwise_rate_ledger_failures_total`, so an outage neither lets a tenant
past its limit nor refuses everyone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from app.config import AppConfig
from app.rate_limit import Lease, LeasedAllowance, TenantLimiter
from deployments.metrics import zero_counter
from deployments.plan_store import NAMESPACE, STORE_GONE

logger = logging.getLogger("ray.serve")
# How long an ingress replica waits for a lease before it limits on its own; longer until the
# ledger first answers (a new actor's worker takes seconds to start on a busy machine).
LEASE_TIMEOUT_S = 2.0
FIRST_LEASE_TIMEOUT_S = 30.0

Limits = dict[str, tuple[float | None, float | None]]


def tenant_limits(config: AppConfig, divide_by: int = 1) -> Limits:
    """Each limited tenant's (requests/s, tokens/s), divided by `divide_by` (a replica's share)."""
    return {k.tenant: (k.requests_per_s and k.requests_per_s / divide_by, k.tokens_per_s and k.tokens_per_s / divide_by)
            for k in config.api_keys if k.requests_per_s or k.tokens_per_s}


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class RateLedger:
    def __init__(self) -> None:
        self._key: str | None = None
        self._limiter = TenantLimiter({}, 1.0)

    def configure(self, limits: Limits, burst_s: float) -> None:
        """Take the app's limits (new buckets, full)."""
        self._key = limits_key(limits, burst_s)
        self._limiter = TenantLimiter(limits, burst_s)

    def lease(self, tenant: str, tokens: int, share: float, key: str) -> Lease | None:
        """The tenant's lease (TenantLimiter.lease); None when the asker's limits (`key`)
        are not the ledger's: a new or restarted ledger, or a redeploy that changed them.
        The asker then configures it and asks again."""
        if key != self._key:
            return None
        return self._limiter.lease(tenant, tokens, time.monotonic(), share)


def limits_key(limits: Limits, burst_s: float) -> str:
    """The same in every process for the same limits (str hashes are salted per process)."""
    return hashlib.sha256(repr((sorted(limits.items()), burst_s)).encode()).hexdigest()[:16]


def rate_ledger(app_name: str):
    # mypy keeps a class decorator's input type (python/mypy#3135): this is Ray's ActorClass.
    return RateLedger.options(  # type: ignore[attr-defined]
        name=f"rate-{app_name}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


class RateLimitGate:
    """One ingress replica's rate limiting: its leased allowance first, then the app's
    ledger (`ledger_of` looks it up; None outside Serve, where this process holds the
    whole limit), then, while the ledger does not answer, its share of every limit."""

    def __init__(self, config: AppConfig, app_name: str = "", ledger_of: Callable[[], Any] | None = None,
                 share: float = 0.1) -> None:
        self.app_name, self.share, self._ledger_of = app_name, share, ledger_of
        self.limits, self.burst_s = tenant_limits(config), config.rate_limit_burst_s
        self._key = limits_key(self.limits, self.burst_s)
        self.allowance = LeasedAllowance()
        # Created (and its worker started) with the replica, not on the first limited request.
        self._ledger: Any = ledger_of() if ledger_of is not None and self.limits else None
        self._answered = False
        replicas = config.ingress_replicas if ledger_of is not None else 1
        self._alone = TenantLimiter(tenant_limits(config, replicas), self.burst_s)
        self._failing = False
        self.failures = ray_metrics.Counter(
            "wattwise_rate_ledger_failures_total",
            "Rate-limit checks an ingress replica made on its own because the app's rate ledger did not answer.",
            tag_keys=("application",))
        zero_counter(self.failures, {"application": app_name})

    async def retry_after_s(self, tenant: str, tokens: int) -> float | None:
        """None if the request may go ahead (and it is charged), else seconds to wait."""
        if tenant not in self.limits:
            return None
        now_s = time.monotonic()
        if self.allowance.take(tenant, tokens, now_s):
            return None
        if (refused_s := self.allowance.refused_for_s(tenant, now_s)) is not None:
            return refused_s
        if self._ledger_of is None:
            return self._alone.retry_after_s(tenant, tokens, now_s)
        try:
            timeout_s = LEASE_TIMEOUT_S if self._answered else FIRST_LEASE_TIMEOUT_S
            lease = await asyncio.wait_for(self._lease(tenant, tokens), timeout_s)
        except Exception as exc:  # the ledger is down or slow: limit on this replica's share
            self._failed(exc)
            return self._alone.retry_after_s(tenant, tokens, time.monotonic())
        self._answered = True
        if self._failing:
            logger.warning("wattwise: the rate ledger of %r answers again", self.app_name)
            self._failing = False
        self.allowance.add(tenant, lease, time.monotonic())
        return lease.retry_after_s

    async def _lease(self, tenant: str, tokens: int) -> Lease:
        """Only for a limited tenant, so the ledger was created with this gate."""
        lease = await self._ledger.lease.remote(tenant, tokens, self.share, self._key)
        if lease is None:  # a new or restarted ledger, or new limits: configure it, then ask again
            await self._ledger.configure.remote(self.limits, self.burst_s)
            lease = await self._ledger.lease.remote(tenant, tokens, self.share, self._key)
        return lease

    def _failed(self, exc: BaseException) -> None:
        self.failures.inc(1, {"application": self.app_name})
        if isinstance(exc, STORE_GONE):  # gone for good: look it up again by name (recreates it)
            self._ledger = None
        if not self._failing:
            logger.warning("wattwise: the rate ledger of %r did not answer (%s); limiting on this replica's share "
                           "until it does", self.app_name, type(exc).__name__)
            self._failing = True
