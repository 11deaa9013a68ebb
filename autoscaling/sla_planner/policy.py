"""NVIDIA Dynamo's SLA planner (throughput-based scaling) as a pure policy: `sla-planner`.

Followed: Dynamo's `docs/architecture/sla_planner.md` (scaling algorithm, steps 1-5) and
`components/planner/src/dynamo/planner/utils/planner_core.py` (`observe_metrics`,
`make_adjustments`, `_compute_replica_requirements`), defaults from `.../planner/defaults.py`
(`SLAPlannerDefaults`: adjustment interval 180 s, load predictor `arima` on 50 points,
min_endpoint 1; correction factors on unless `--no-correction`). Every adjustment interval,
per pool, at max clock:
1. observe the interval's request count, TTFT and ITL, and the mean concurrency per replica;
2. correction factors: observed TTFT / the profile's TTFT of one prompt of the mean ISL;
   observed ITL / the profile's ITL at the observed concurrency and context ISL + OSL / 2;
3. predict the next interval's request count (the load predictor);
4. prefill replicas = ceil(count * ISL / interval * min(1, TTFT correction)
   / (the profile's prefill tokens/s per GPU at the ISL) / TP); decode replicas =
   ceil(count * OSL / interval / (the profile's best decode tokens/s per GPU within
   ITL target / ITL correction, at that context) / TP);
5. scale to them.
Dynamo sizes disaggregated prefill and decode pools; here a pool's replicas do both (chunked
prefill), so a pool gets the binding one of the two counts, as Dynamo's aggregated planner
(`.../planner/core/agg.py`) scales up when either dimension asks for more. Dynamo forecasts
ISL and OSL too; our replicas do not report request sizes, so each pool's ISL and OSL are the
configured means (Dynamo's profiling inputs, `profile_sla --isl --osl`). Dynamo's GPU budget
(`max_gpu_budget`) is left to the runtime's cluster size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.sla_planner.load_predictors import ArimaPredictor, ConstantPredictor, LoadPredictor
from core.plan import ClusterPlan
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load


class SlaPool(BaseModel):
    """One pool as the planner's profile sees it: its engine, SLOs and request sizes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_parallel: int = Field(gt=0, description="TP of the pool's replicas (the profiler's recommendation).")
    clock_mhz: int = Field(gt=0, description="GPU clock the pool is locked at (the baseline: max clock).")
    ttft_s: float = Field(gt=0, description="TTFT target of the pool (its tightest class).")
    itl_s: float = Field(gt=0, description="ITL (mean TBT) target of the pool (its tightest class).")
    mean_prompt_tokens: float = Field(gt=0, description="Mean input length (ISL) the pool is planned for.")
    mean_output_tokens: float = Field(gt=0, description="Mean output length (OSL) the pool is planned for.")

    @property
    def context_tokens(self) -> float:
        return self.mean_prompt_tokens + self.mean_output_tokens / 2


class SlaPlannerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: dict[str, SlaPool] = Field(description="Deployment name -> the pool the planner sizes.")
    model: str = Field(default="llama2-70b", description="Model the profile's throughputs are read for.")
    hardware: str = Field(default="h100-80gb", description="GPU the profile's throughputs are read for.")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles); None: the default for model and hardware."))
    adjustment_interval_s: float = Field(default=180.0, gt=0, description=(
        "Seconds between adjustments (Dynamo's default adjustment_interval: 180)."))
    load_predictor: Literal["arima", "constant"] = Field(default="arima", description=(
        "Predictor of the next interval's request count (Dynamo's default: arima)."))
    prediction_window: int = Field(default=50, gt=0, description=(
        "Intervals the predictor fits on (Dynamo's load_prediction_window_size: 50)."))
    min_endpoint: int = Field(default=1, ge=0, description="Fewest replicas per pool (Dynamo's min_endpoint: 1).")
    correction: bool = Field(default=True, description=(
        "Correct the profile by observed TTFT and ITL (Dynamo's default; --no-correction turns it off)."))


@dataclass
class _Interval:
    """What one pool showed over the current adjustment interval, sampled every tick."""

    rate_s: float = 0.0  # integral of the arrival rate: requests
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    concurrency: list[float] = field(default_factory=list)

    def add(self, dep: DeploymentView, dt_s: float) -> None:
        stats = dep.replica_stats
        self.rate_s += sum(sum(s.class_rates_per_s.values()) for s in stats) * dt_s
        self.seconds += dt_s
        busy = [s for s in stats if s.running_requests > 0]
        if busy:
            self.itl.append(sum(s.itl_ewma_s for s in busy) / len(busy))
            self.concurrency.append(sum(s.running_requests for s in stats) / len(stats))
        ttfts = [s.ttft_ewma_s for s in stats if s.ttft_ewma_s > 0]
        if ttfts:
            self.ttft.append(sum(ttfts) / len(ttfts))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class SlaPlannerPolicy:
    def __init__(self, config: SlaPlannerConfig) -> None:
        self.config = config
        self.cap = CapacityModel(default_perf_model(config.model, config.hardware, config.profile))
        self._predictors: dict[str, LoadPredictor] = {
            name: ArimaPredictor(config.prediction_window) if config.load_predictor == "arima" else ConstantPredictor()
            for name in config.pools}
        self._interval = {name: _Interval() for name in config.pools}
        self._correction = {name: (1.0, 1.0) for name in config.pools}  # (prefill, decode)
        self._replicas: dict[str, int] = {}
        self._last_s: float | None = None
        self._adjusted_s: float | None = None

    def _prefill_tokens_per_gpu_s(self, pool: SlaPool) -> float:
        return prefill_tokens_per_gpu_s(self.cap, pool.tensor_parallel, pool.clock_mhz, pool.mean_prompt_tokens)

    def _decode_tokens_per_gpu_s(self, pool: SlaPool, itl_s: float) -> float:
        return decode_tokens_per_gpu_s(self.cap, pool.tensor_parallel, pool.clock_mhz, pool.context_tokens, itl_s)

    def _correct(self, name: str, pool: SlaPool, seen: _Interval) -> None:
        """Step 2: the correction factors from the interval's observed TTFT and ITL."""
        prefill, decode = self._correction[name]
        ttft, itl, concurrency = _mean(seen.ttft), _mean(seen.itl), _mean(seen.concurrency)
        if ttft is not None:
            prefill = ttft / self.cap.prefill_s(pool.tensor_parallel, pool.clock_mhz, pool.mean_prompt_tokens)
        if itl is not None and concurrency is not None:
            expected = self.cap.decode_iteration_s(pool.tensor_parallel, pool.clock_mhz, max(concurrency, 1.0),
                                                   pool.context_tokens)
            decode = itl / expected
        self._correction[name] = (prefill, decode)

    def replicas_for(self, name: str, requests: float) -> int:
        """Step 4: replicas for `requests` arriving over the next interval, the binding one of
        the prefill and the decode count."""
        pool, interval = self.config.pools[name], self.config.adjustment_interval_s
        prefill_correction, decode_correction = self._correction[name]
        prefill_tokens_s = requests * pool.mean_prompt_tokens / interval * min(1.0, prefill_correction)
        prefill = math.ceil(prefill_tokens_s / self._prefill_tokens_per_gpu_s(pool) / pool.tensor_parallel)
        itl = pool.itl_s / decode_correction if decode_correction > 0 else pool.itl_s
        decode_tokens_s = requests * pool.mean_output_tokens / interval
        decode = math.ceil(decode_tokens_s / self._decode_tokens_per_gpu_s(pool, itl) / pool.tensor_parallel)
        return max(prefill, decode, self.config.min_endpoint)

    def _adjust(self, name: str) -> None:
        seen = self._interval[name]
        if self.config.correction:
            self._correct(name, self.config.pools[name], seen)
        predictor = self._predictors[name]
        predictor.add(seen.rate_s / max(seen.seconds, 1e-9) * self.config.adjustment_interval_s)
        self._replicas[name] = self.replicas_for(name, predictor.predict())
        self._interval[name] = _Interval()

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        dt = 0.0 if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        if self._adjusted_s is None:
            self._adjusted_s = now_s
        for name, dep in view.deployments.items():
            if name in self._interval:
                self._interval[name].add(dep, dt)
        if now_s - self._adjusted_s >= self.config.adjustment_interval_s:
            self._adjusted_s = now_s
            for name in self.config.pools:
                self._adjust(name)
        pools = self.config.pools
        return ClusterPlan(
            replicas=dict(self._replicas),
            tensor_parallel={n: p.tensor_parallel for n, p in pools.items()},
            clock_mhz={n: p.clock_mhz for n, p in pools.items()},
            reason="sla-planner",
        )


def prefill_tokens_per_gpu_s(cap: CapacityModel, tp: int, clock_mhz: float, prompt_tokens: float) -> float:
    """The profile's prefill throughput per GPU: one prompt of `prompt_tokens` at a time."""
    return prompt_tokens / cap.prefill_s(tp, clock_mhz, prompt_tokens) / tp


def decode_tokens_per_gpu_s(cap: CapacityModel, tp: int, clock_mhz: float, context_tokens: float,
                            itl_s: float) -> float:
    """The profile's best decode throughput per GPU whose ITL is within `itl_s` (the largest
    batch that fits it and the KV cache) at `context_tokens` per sequence."""
    batch = cap.max_batch(tp, clock_mhz, context_tokens, itl_s)
    return batch / cap.decode_iteration_s(tp, clock_mhz, batch, context_tokens) / tp


def recommended_tp(cap: CapacityModel, shape: Load, ttft_s: float, itl_s: float) -> int:
    """The TP Dynamo's profiler (`benchmarks/profiler/profile_sla.py`) recommends, for a pool
    that does both phases, at max clock: among the TPs whose prefill of the mean ISL meets the
    TTFT target (else the fastest prefill), the most decode tokens/s per GPU within the ITL
    target."""
    clock = cap.perf.gpu.max_clock_mhz
    tps = cap.perf.tensor_parallel_degrees
    meeting = [tp for tp in tps if cap.prefill_s(tp, clock, shape.mean_prompt_tokens) <= ttft_s]
    if not meeting:
        return min(tps, key=lambda tp: cap.prefill_s(tp, clock, shape.mean_prompt_tokens))
    return max(meeting, key=lambda tp: decode_tokens_per_gpu_s(cap, tp, clock, shape.mean_context_tokens, itl_s))
