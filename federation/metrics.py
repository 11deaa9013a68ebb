"""The front door's Prometheus metrics, per cloud (GET /metrics).

The front runs outside Ray, so it exports with prometheus_client on a registry of its own,
under the same names' scheme as the apps (`wattwise_federation_*`). It also keeps the
counts /admin/requests answers: every accepted request ends in exactly one outcome.
"""

from __future__ import annotations

from collections import Counter as Counts

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from app.cloud_dispatch import CloudStatus

OUTCOMES = ("completed", "error_retryable", "error_final", "cancelled")
# What one try of a request on a cloud came to.
ATTEMPT_RESULTS = ("started", "unreachable", "overloaded", "refused", "rate_limited", "moved", "broken")


class FrontMetrics:
    def __init__(self, clouds: list[str]) -> None:
        self.registry = CollectorRegistry()
        self.counts: Counts[str] = Counts({"accepted": 0, **dict.fromkeys(OUTCOMES, 0)})
        self.requests = Counter("wattwise_federation_requests", "Requests the front accepted, by outcome.",
                                ("outcome",), registry=self.registry)
        self.attempts = Counter("wattwise_federation_attempts", "Tries of a request on a cloud, by what came of it.",
                                ("cloud", "result"), registry=self.registry)
        self.resumes = Counter("wattwise_federation_resumes", "Streams resumed on another cloud after theirs failed.",
                               ("from_cloud", "to_cloud"), registry=self.registry)
        self.offloads = Counter("wattwise_federation_offloads", "Requests not started moved to an idle cloud (Mico).",
                                ("from_cloud", "to_cloud"), registry=self.registry)
        self.tokens = Counter("wattwise_federation_generated_tokens", "Tokens each cloud streamed through the front.",
                              ("cloud",), registry=self.registry)
        self.outstanding = Gauge("wattwise_federation_outstanding_tokens", "Predicted tokens the front has "
                                 "outstanding on each cloud, plus what its report adds.", ("cloud",),
                                 registry=self.registry)
        self.placed = Gauge("wattwise_federation_placed_tokens", "Predicted tokens (prompt + predicted output) the "
                            "front placed on each cloud since it started.", ("cloud",), registry=self.registry)
        self.capacity = Gauge("wattwise_federation_capacity", "Each cloud's capacity in the dispatch rule (GPUs).",
                              ("cloud",), registry=self.registry)
        self.speed = Gauge("wattwise_federation_speed", "The back-off: the share of its capacity a cloud counts with "
                           "(1: keeping up).", ("cloud",), registry=self.registry)
        self.available = Gauge("wattwise_federation_available", "1 while a cloud takes requests, 0 while it rests "
                               "after a failure.", ("cloud",), registry=self.registry)
        for cloud in clouds:
            for result in ATTEMPT_RESULTS:
                self.attempts.labels(cloud, result)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)

    def accepted(self) -> None:
        self.counts["accepted"] += 1

    def outcome(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self.requests.labels(outcome).inc()

    def attempt(self, cloud: str, result: str) -> None:
        self.attempts.labels(cloud, result).inc()

    def clouds(self, statuses: dict[str, CloudStatus]) -> None:
        for cloud, s in statuses.items():
            self.outstanding.labels(cloud).set(s.outstanding_tokens + s.foreign_tokens)
            self.placed.labels(cloud).set(s.dispatched_tokens)
            self.capacity.labels(cloud).set(s.capacity)
            self.speed.labels(cloud).set(s.speed)
            self.available.labels(cloud).set(float(s.available))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
