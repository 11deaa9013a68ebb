"""The one decision object every controller returns and every runtime applies (the Serve
runtime broadcasts it with what only it knows: core.published_plan)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.roles import BATCH_QUEUE_DEPLOYMENT


@dataclass(frozen=True)
class ClusterPlan:
    """Replicas, TP, clocks, batch limits and routing weights, keyed by deployment name.

    A controller fills only the fields it owns; `merge` layers controllers that run on
    different epochs (DynamoLLM's cluster / pool / instance managers) into one plan. The
    floors (`batch_rate_floor_per_s`, `backlog_instances`, `late_ttft_s`) are what one layer
    of the wattwise policy tells a later one: runtimes do not apply them; they say why a pool
    has the shape it has.
    """

    replicas: dict[str, int] = field(default_factory=dict)
    tensor_parallel: dict[str, int] = field(default_factory=dict)
    clock_mhz: dict[str, int] = field(default_factory=dict)
    # Pool -> (lowest, highest) clock the replicas' per-step clock hook may pick
    # (throttLL'eM searches inside the band the planner publishes).
    clock_band_mhz: dict[str, tuple[int, int]] = field(default_factory=dict)
    batch_limit: dict[str, int] = field(default_factory=dict)
    routing_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    # The global batch queue's deployment -> batch requests it may have out on the pools at
    # once (Chiron's Algorithm 2 raises it when the queue's deadlines need a faster drain).
    batch_in_flight: dict[str, int] = field(default_factory=dict)
    # Length class -> since when (the policy's time, s) the SLO guard has stopped saving for it:
    # its attainment fell below target, so the pools hosting it run flat out, unfolded, with
    # more margin (autoscaling.slo_guard). Empty: every class meets its target.
    slo_guard: dict[str, float] = field(default_factory=dict)
    # Length class -> the batch rate (req/s) the global batch queue's deadlines need from the
    # pools (Chiron's Algorithm 2): a floor under the class's planned batch load.
    batch_rate_floor_per_s: dict[str, float] = field(default_factory=dict)
    # Pool -> instances its waiting interactive requests call for, where that outgrows what
    # it runs (the catch-up after a burst): a floor under the instances planned for it.
    backlog_instances: dict[str, int] = field(default_factory=dict)
    # Pool -> the highest mean TTFT (s) of its replicas, where one is over its classes' target:
    # the pool is planned one instance beyond the forecast.
    late_ttft_s: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def queue_in_flight(self, floor: int) -> int:
        """The global batch queue's bound on requests out at once, as every runtime applies
        it: the plan's, never below the runtime's own `floor` (the Batch API's max_in_flight)."""
        return max(floor, self.batch_in_flight.get(BATCH_QUEUE_DEPLOYMENT, 0))

    def merge(self, other: ClusterPlan) -> ClusterPlan:
        """Fields set in `other` win; the rest are kept."""
        return replace(
            self,
            replicas={**self.replicas, **other.replicas},
            tensor_parallel={**self.tensor_parallel, **other.tensor_parallel},
            clock_mhz={**self.clock_mhz, **other.clock_mhz},
            clock_band_mhz={**self.clock_band_mhz, **other.clock_band_mhz},
            batch_limit={**self.batch_limit, **other.batch_limit},
            routing_weights={**self.routing_weights, **other.routing_weights},
            batch_in_flight={**self.batch_in_flight, **other.batch_in_flight},
            slo_guard={**self.slo_guard, **other.slo_guard},
            batch_rate_floor_per_s={**self.batch_rate_floor_per_s, **other.batch_rate_floor_per_s},
            backlog_instances={**self.backlog_instances, **other.backlog_instances},
            late_ttft_s={**self.late_ttft_s, **other.late_ttft_s},
            reason="; ".join(r for r in (self.reason, other.reason) if r),
        )
