"""The one decision object every controller publishes and every runtime applies."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.roles import BATCH_QUEUE_DEPLOYMENT


@dataclass(frozen=True)
class ClusterPlan:
    """Replicas, TP, clocks, batch limits and routing weights, keyed by deployment name.

    A controller fills only the fields it owns; `merge` layers controllers that run on
    different epochs (DynamoLLM's cluster / pool / instance managers) into one plan.
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
    # Pool -> the deployment serving its traffic, for pools whose TP changes run as shadow
    # deployments (autoscaling.shadow_rollout); set by the Serve runtime, not by policies.
    serving: dict[str, str] = field(default_factory=dict)
    # Pools an operator drained (POST /admin/drain): the ingress routes them no new
    # requests. Layered in by the plan store, so every ingress replica sees the same.
    drained: dict[str, bool] = field(default_factory=dict)
    # Deployment -> its replicas running when the plan went out, as Serve's controller counts
    # them: the ingress sends a request overflowing its pool only to a pool with one running
    # (asking Serve's status instead costs the ingress ~0.13 s of CPU a call). Set by the
    # Serve runtime, not by policies.
    running_replicas: dict[str, int] = field(default_factory=dict)
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
            serving={**self.serving, **other.serving},
            drained={**self.drained, **other.drained},
            running_replicas={**self.running_replicas, **other.running_replicas},
            reason="; ".join(r for r in (self.reason, other.reason) if r),
        )
