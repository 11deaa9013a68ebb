"""Chiron's Algorithm 2 as a layer of the one controller: the batch capacity the global
queue's deadlines call for.

Chiron alone adds batch replicas until batch backpressure (BBP: request groups whose
estimated wait overruns their deadline, §5.3) is zero. Inside the wattwise policy, batch work runs
on the length pools' replicas behind interactive work (Chiron's mixed replicas), so this
layer's answer is load, not replicas: the batch request rate at which BBP is zero, which
DynamoLLM's planner sizes the pools for like any other load (a floor under the batch mean it
plans already), and how many batch requests the queue may have out on the pools at once to
reach that rate (Little's law on the time one spends there; each runtime keeps its own floor,
the Batch API's `max_in_flight`). A job that fits its deadline at
the queue's usual pace changes nothing; one that does not gets the pools and the concurrency
to finish in time, and gives them back as the queue drains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.chiron.batch_queue import deadline_tokens_per_s
from autoscaling.chiron.queue_summary import groups_from_metrics


class DeadlineCapacityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description=(
        "Plan the batch rate the global queue's deadlines need (Chiron's Algorithm 2); False: batch "
        "work gets its mean arrival rate only."))
    max_in_flight: int = Field(default=1024, gt=0, description="Most batch requests out on the pools at once.")
    deadline_margin: float = Field(default=0.8, gt=0, le=1, description=(
        "Share of the time to each deadline to plan the queue's drain into (the rest absorbs estimation error)."))


@dataclass(frozen=True)
class BatchDemand:
    """What the queue's deadlines need from the pools."""

    requests_per_s: float  # the batch request rate at which no request group misses its deadline
    in_flight: int  # batch requests the queue needs out at once (a runtime never goes below its own floor)


class DeadlineCapacity:
    """Reads the queue's request groups (queue_summary's metrics) and answers BatchDemand."""

    def __init__(self, config: DeadlineCapacityConfig) -> None:
        self.config = config

    def demand(self, queue_metrics: dict[str, float], now_s: float, itl_s: float) -> BatchDemand:
        """`itl_s`: the pools' time between tokens; a batch request's mean output at it is the
        time one spends on a replica, which sets the concurrency the rate needs."""
        cfg = self.config
        groups = groups_from_metrics(queue_metrics)
        if not cfg.enabled or not groups:
            return BatchDemand(0.0, 0)
        mean = queue_metrics.get("output_mean_tokens", 200.0)
        std = queue_metrics.get("output_std_tokens", 150.0)
        # Planning into a share of each deadline is planning against deadlines that near.
        shrunk = [replace(g, deadline_s=now_s + (g.deadline_s - now_s) * cfg.deadline_margin) for g in groups]
        rate = deadline_tokens_per_s(shrunk, now_s, mean, std) / max(mean, 1.0)
        in_flight = min(math.ceil(rate * mean * itl_s), cfg.max_in_flight)
        return BatchDemand(rate, in_flight)
