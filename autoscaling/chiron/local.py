"""Chiron's local autoscaler (Algorithm 1): a replica's max batch size from backpressure.

LBP = ITL / ITL-SLO (the smallest ITL SLO among requests running there); TBP =
throughput_prev / throughput_curr. If max(LBP, TBP) >= 1 the limit halves; otherwise it
grows by EWMA toward limit / backpressure (slower as backpressure nears 1). Guards:
no update without fresh tokens; backpressure only shrinks a batch that is full (a slow
ITL or a throughput drop below the limit comes from prefills or a light load, and
halving would starve the queue); the limit stays in bounds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LocalAutoscalerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(default=0.5, gt=0, le=1, description=(
        "EWMA weight of the growth step toward limit / backpressure (Algorithm 1)."))
    min_batch: int = Field(default=8, ge=1, description=(
        "Smallest batch limit; halving below this starved queues in simulation."))
    max_batch: int = Field(default=4096, ge=1, description="Largest batch limit.")
    initial_batch: int = Field(default=16, ge=1, description="Batch limit a replica starts with.")
    min_tokens_per_update: int = Field(default=8, ge=1, description=(
        "New tokens needed before an update; fewer make a noisy sample, and the limit stays."))


class LocalBatchAutoscaler:
    def __init__(self, config: LocalAutoscalerConfig = LocalAutoscalerConfig()) -> None:
        self.config = config
        self.max_batch_size = float(config.initial_batch)
        self._prev_throughput: float | None = None
        self._tokens_seen = 0

    @property
    def limit(self) -> int:
        return int(self.max_batch_size)

    def backpressure(self, itl_s: float, itl_slo_s: float, throughput: float, saturated: bool) -> float:
        lbp = itl_s / itl_slo_s if itl_slo_s > 0 else 0.0
        if not saturated:  # a batch below its limit is not what stretches the ITL: never halve for it
            lbp = min(lbp, 0.99)
        tbp = 0.0
        if saturated and self._prev_throughput and throughput > 0:
            tbp = self._prev_throughput / throughput
        return max(lbp, tbp)

    def update(self, itl_s: float, itl_slo_s: float, throughput: float, running: int, tokens_total: int) -> int:
        """One step of Algorithm 1 on the replica's latest counters; returns the new limit."""
        if tokens_total - self._tokens_seen < self.config.min_tokens_per_update or itl_s <= 0:
            return self.limit
        self._tokens_seen = tokens_total
        saturated = running >= self.limit
        pressure = self.backpressure(itl_s, itl_slo_s, throughput, saturated)
        if pressure >= 1.0:
            self.max_batch_size /= 2
        elif pressure > 0:
            a = self.config.alpha
            self.max_batch_size = a * (1.0 / pressure) * self.max_batch_size + (1 - a) * self.max_batch_size
        self.max_batch_size = min(max(self.max_batch_size, self.config.min_batch), self.config.max_batch)
        self._prev_throughput = throughput
        return self.limit
