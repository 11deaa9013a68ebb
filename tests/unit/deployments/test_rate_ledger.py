"""An ingress replica's rate limiting against the app's ledger (issue 18: a tenant's limit
holds across ingress replicas): leases, a ledger that forgot its limits, one that does not
answer. The ledger's own code runs in-process here; tests/ray/test_serve.py drives it
through two ingress replicas over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

from app.config import ApiKey, AppConfig, hash_key
from deployments.rate_ledger import RateLedger, RateLimitGate

LedgerClass = RateLedger.__ray_actor_class__  # the class under @ray.remote: its methods in-process


class _Method:
    def __init__(self, call: Any, log: list[str], name: str) -> None:
        self.call, self.log, self.name = call, log, name

    async def remote(self, *args: Any) -> Any:
        self.log.append(self.name)
        return self.call(*args)


class _LocalLedger:
    """The ledger's code behind the `.method.remote()` calls the gate makes of its actor."""

    def __init__(self, ledger: Any = None) -> None:
        self.ledger = ledger or LedgerClass()
        self.log: list[str] = []
        self.lease = _Method(self.ledger.lease, self.log, "lease")
        self.configure = _Method(self.ledger.configure, self.log, "configure")


class _DeadLedger:
    def __init__(self) -> None:
        self.lease = self.configure = self

    async def remote(self, *args: Any) -> Any:
        raise ConnectionError("ledger unreachable")


def _config(requests_per_s: float, replicas: int = 2) -> AppConfig:
    return AppConfig(api_keys=[ApiKey(sha256=hash_key("sk-x"), tenant="t", requests_per_s=requests_per_s)],
                     rate_limit_burst_s=1.0, ingress_replicas=replicas)


def _admitted(gate: RateLimitGate, requests: int) -> int:
    async def run() -> int:
        return sum([await gate.retry_after_s("t", 1) is None for _ in range(requests)])
    return asyncio.run(run())


def test_two_gates_share_one_ledgers_limit() -> None:
    ledger = _LocalLedger()
    gates = [RateLimitGate(_config(20.0), "app", ledger_of=lambda: ledger) for _ in range(2)]
    admitted = sum(_admitted(gate, 30) for gate in gates)  # 60 requests at once, 20 of burst
    assert 20 <= admitted <= 21  # (a refill of ~1 request while the test runs)
    assert ledger.log.count("configure") == 1  # the first gate configured it; the second found it ready
    assert _admitted(RateLimitGate(_config(20.0), "app"), 30) == 20  # no ledger (outside Serve): the whole limit


def test_a_restarted_ledger_is_configured_again_and_new_limits_replace_old_ones() -> None:
    ledger = _LocalLedger()
    assert _admitted(RateLimitGate(_config(5.0), "app", ledger_of=lambda: ledger), 10) == 5
    restarted = _LocalLedger()  # Ray restarted it: it has no limits
    assert _admitted(RateLimitGate(_config(5.0), "app", ledger_of=lambda: restarted), 10) == 5
    assert restarted.log[:3] == ["lease", "configure", "lease"]
    # A redeploy with a higher limit: the ledger takes the new one (not the old, forgotten buckets).
    assert _admitted(RateLimitGate(_config(8.0), "app", ledger_of=lambda: ledger), 10) == 8


def test_unreachable_ledger_limits_each_replica_at_its_share() -> None:
    gate = RateLimitGate(_config(20.0, replicas=4), "app", ledger_of=_DeadLedger)
    assert _admitted(gate, 30) == 5  # 20 / 4 replicas: no tenant past its limit, nobody refused outright
    assert asyncio.run(RateLimitGate(_config(20.0), "app", ledger_of=_DeadLedger).retry_after_s("other", 10**6)) is None
