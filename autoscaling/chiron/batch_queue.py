"""The global batch queue as Chiron's global autoscaler sees it: request groups and
their estimated waits (§5.3, eq. 1-2).

Requests are grouped by TTFT deadline (1-D clustering: deadlines within `window_s` of a
group's first form one group) and served FCFS inside a group, groups in deadline order.
A group's wait is the output tokens queued ahead of its last request over the token
throughput. Output lengths are unknown, so the tokens ahead of q requests are Normal
(q*mu, sqrt(q)*sigma) by the CLT; we plan for its `z`-quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuedBatchRequest:
    enqueued_s: float
    deadline_s: float  # when its TTFT target runs out


@dataclass(frozen=True)
class RequestGroup:
    deadline_s: float  # the earliest deadline in the group
    count: int


class OutputLengthStats:
    """Online mean and standard deviation of observed output lengths (Welford)."""

    def __init__(self, prior_mean: float = 200.0, prior_std: float = 150.0) -> None:
        self.n = 0
        self.mean = prior_mean
        self._m2 = 0.0
        self._prior_std = prior_std

    def observe(self, tokens: int) -> None:
        self.n += 1
        delta = tokens - (self.mean if self.n > 1 else tokens)
        self.mean = tokens if self.n == 1 else self.mean + delta / self.n
        self._m2 += delta * (tokens - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else self._prior_std


def group_requests(queue: list[QueuedBatchRequest], window_s: float = 300.0) -> list[RequestGroup]:
    groups: list[RequestGroup] = []
    for req in sorted(queue, key=lambda r: (r.deadline_s, r.enqueued_s)):
        if groups and req.deadline_s - groups[-1].deadline_s <= window_s:
            groups[-1] = RequestGroup(groups[-1].deadline_s, groups[-1].count + 1)
        else:
            groups.append(RequestGroup(req.deadline_s, 1))
    return groups


def tokens_ahead(groups: list[RequestGroup], mean_tokens: float, std_tokens: float,
                 z: float = 1.645) -> list[float]:
    """Per group: the output tokens served before its last request starts (eq. 1's
    numerator, at the CLT's `z`-quantile)."""
    tokens = []
    before = 0
    for g in groups:
        ahead = before + g.count - 1  # requests served before the group's last one starts
        tokens.append(ahead * mean_tokens + z * math.sqrt(ahead) * std_tokens)
        before += g.count
    return tokens


def group_waits_s(groups: list[RequestGroup], mean_tokens: float, std_tokens: float, tokens_per_s: float,
                  z: float = 1.645) -> list[float]:
    """Estimated time until each group's last request starts (eq. 1, CLT quantile)."""
    return [t / tokens_per_s if tokens_per_s > 0 else (0.0 if t == 0 else math.inf)
            for t in tokens_ahead(groups, mean_tokens, std_tokens, z)]


def deadline_tokens_per_s(groups: list[RequestGroup], now_s: float, mean_tokens: float, std_tokens: float,
                          late_slack_s: float = 1.0) -> float:
    """The least token throughput at which BBP (eq. 2) is zero: every group's tokens ahead
    served before its deadline. A group already past its deadline needs its tokens ahead
    within `late_slack_s` (as fast as the pools can go; the plan caps it)."""
    return max((t / max(g.deadline_s - now_s, late_slack_s)
                for g, t in zip(groups, tokens_ahead(groups, mean_tokens, std_tokens), strict=True)), default=0.0)


def batch_backpressure(groups: list[RequestGroup], now_s: float, mean_tokens: float, std_tokens: float,
                       tokens_per_s: float) -> int:
    """BBP (eq. 2): the number of groups whose estimated wait overruns their deadline."""
    waits = group_waits_s(groups, mean_tokens, std_tokens, tokens_per_s)
    return sum(1 for g, w in zip(groups, waits, strict=True) if now_s + w > g.deadline_s)


def batch_instances_needed(groups: list[RequestGroup], now_s: float, mean_tokens: float, std_tokens: float,
                           tokens_per_s_per_instance: float, spare_tokens_per_s: float = 0.0,
                           max_instances: int = 64) -> int:
    """Algorithm 2: the fewest batch instances that bring BBP to zero (capped)."""
    for n in range(0, max_instances + 1):
        rate = spare_tokens_per_s + n * tokens_per_s_per_instance
        if batch_backpressure(groups, now_s, mean_tokens, std_tokens, rate) == 0:
            return n
    return max_instances
