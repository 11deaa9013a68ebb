"""The seeds' baselines as control policies (DynamoLLM §V-A, Chiron, throttLL'eM).

Static ones (SinglePool, MultiPool, Triton-like static max clock) publish the plan they
were provisioned with. ScaleInst, ScaleShard and ScaleFreq start from MultiPool's plan
and move one knob each with the load the replicas report: instances, TP, or clock.
Their capacity judgements come from the shared CapacityModel, so they use the same
perf model as the replicas they steer.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.utilisation import UtilisationConfig, UtilisationPolicy
from core.plan import ClusterPlan
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel


class PoolPlanConfig(BaseModel):
    """The provisioned plan per deployment, and the model its capacity is judged on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replicas: dict[str, int] = Field(description="Provisioned replicas per deployment.")
    tensor_parallel: dict[str, int] = Field(description="Provisioned TP per deployment.")
    clock_mhz: dict[str, int] = Field(description="Provisioned GPU clock (MHz) per deployment.")
    model: str = Field(default="llama2-70b", description="Model capacity is judged on.")
    hardware: str = Field(default="h100-80gb", description="GPU capacity is judged on.")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile capacity is judged on (energy.profiles); None: the default for model and hardware."))
    tbt_s: float = Field(default=0.1, gt=0, description=(
        "TBT target (s) the knobs must keep; DynamoLLM Table IV: 100 ms."))
    headroom: float = Field(default=0.6, gt=0, le=1, description="Share of tbt_s to plan for.")
    default_context_tokens: float = Field(default=1300.0, gt=0, description=(
        "Mean context of a sequence (tokens) when a pool reports none yet (conversation trace ~1.3k)."))
    block_size: int = Field(default=16, gt=0, description=(
        "vLLM's KV block size (tokens): turns reported blocks into context tokens."))
    lower_hold_s: float = Field(default=5.0, ge=0, description=(
        "A knob is lowered only after the lower setting stayed enough this long (s); it is raised at once."))
    clock_step_up: float = Field(default=1.15, gt=1, description=(
        "ScaleFreq: factor the clock rises by while replicas report gaps over budget."))

    def plan(self, reason: str) -> ClusterPlan:
        return ClusterPlan(
            replicas=dict(self.replicas), tensor_parallel=dict(self.tensor_parallel),
            clock_mhz=dict(self.clock_mhz), reason=reason,
        )

    def capacity(self) -> CapacityModel:
        return CapacityModel(default_perf_model(self.model, self.hardware, self.profile))

    def context_tokens(self, stats: tuple[ReplicaStats, ...]) -> float:
        running = sum(s.running_requests for s in stats)
        if running == 0:
            return self.default_context_tokens
        return sum(s.kv_blocks_used for s in stats) * self.block_size / running


class StaticPolicy:
    """SinglePool, MultiPool, static max clock: provisioned once for the peak."""

    def __init__(self, config: PoolPlanConfig, reason: str = "static") -> None:
        self._plan = config.plan(reason)

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        return self._plan


class HoldLower:
    """Raise a knob at once; lower it only after the lower value held for `hold_s`."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._since: dict[str, float] = {}

    def __call__(self, name: str, current: float, wanted: float, now_s: float) -> float:
        if wanted >= current:
            self._since.pop(name, None)
            return wanted
        since = self._since.setdefault(name, now_s)
        if now_s - since >= self.hold_s:
            self._since.pop(name, None)
            return wanted
        return current


class ScaleInstPolicy:
    """Instances per pool with the load, at the provisioned TP and max clock."""

    def __init__(self, config: PoolPlanConfig, downscale_hold_s: float = 60.0) -> None:
        self.config = config
        self._static = config.plan("scaleinst")
        cap = config.capacity()
        self._inner: dict[str, UtilisationPolicy] = {}
        for name, tp in config.tensor_parallel.items():
            per_replica = cap.max_batch(
                tp, config.clock_mhz[name], config.default_context_tokens, config.tbt_s * config.headroom
            )
            self._inner[name] = UtilisationPolicy(
                UtilisationConfig(target_requests_per_replica=per_replica, downscale_hold_s=downscale_hold_s)
            )

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        replicas = {
            name: self._inner[name].desired_replicas(dep, now_s)
            for name, dep in view.deployments.items() if name in self._inner
        }
        return self._static.merge(ClusterPlan(replicas=replicas, reason="load"))


class ScaleFreqPolicy:
    """Static instances; per pool the lowest clock that keeps TBT and drains prompts.

    The clock must make the busiest replica's decode step fit the TBT target and its
    pending prompt tokens prefill within the pool's TTFT target."""

    def __init__(self, config: PoolPlanConfig, ttft_s: dict[str, float] | None = None) -> None:
        self.config = config
        self.ttft_s = ttft_s or {}
        self._cap = config.capacity()
        self._clocks = self._cap.perf.gpu.supported_clocks_mhz()
        self._hold = HoldLower(config.lower_hold_s)
        self._clock = {name: float(c) for name, c in config.clock_mhz.items()}
        self._static = config.plan("scalefreq")

    def _lowest_clock(self, tp: int, stats: ReplicaStats, context: float, ttft_s: float) -> float:
        perf = self._cap.perf
        tbt_budget = self.config.tbt_s * self.config.headroom
        pending = stats.pending_prompt_tokens

        def enough(clock: float) -> bool:
            decode_ok = self._cap.decode_iteration_s(tp, clock, max(stats.running_requests, 1), context) <= tbt_budget
            return decode_ok and (pending == 0 or perf.prefill_time_s(pending, pending * context, tp, clock) <= ttft_s)

        # Both latencies fall as the clock rises: bisect the supported clocks.
        clocks = self._clocks
        lo, hi = 0, len(clocks) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if enough(clocks[mid]):
                hi = mid
            else:
                lo = mid + 1
        return float(clocks[lo])

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        clocks = {}
        for name, dep in view.deployments.items():
            if name not in self._clock:
                continue
            tp = self.config.tensor_parallel[name]
            context = self.config.context_tokens(dep.replica_stats)
            ttft = self.ttft_s.get(name, self.config.tbt_s * 10) * self.config.headroom
            wanted = max(
                (self._lowest_clock(tp, s, context, ttft) for s in dep.replica_stats),
                default=float(self._cap.perf.gpu.min_clock_mhz),
            )
            max_clock = float(self._cap.perf.gpu.max_clock_mhz)
            if dep.queued_outside > 0:
                wanted = max_clock
            # Feedback beside the model: observed gaps over budget (prefills interleaved
            # with decodes) mean the model under-estimates; step the clock up from here.
            elif any(s.itl_ewma_s > self.config.tbt_s * self.config.headroom for s in dep.replica_stats):
                wanted = max(wanted, min(self._clock[name] * self.config.clock_step_up, max_clock))
            self._clock[name] = self._hold(name, self._clock[name], wanted, now_s)
            clocks[name] = int(self._clock[name])
        return self._static.merge(ClusterPlan(clock_mhz=clocks, reason="load"))


class ScaleShardPolicy:
    """Per pool, the TP (and instances of it within the pool's GPUs) with the least
    energy per token at the load reported, at max clock."""

    def __init__(self, config: PoolPlanConfig, ttft_s: dict[str, float] | None = None, hold_s: float = 60.0) -> None:
        self.config = config
        self.ttft_s = ttft_s or {}
        self._cap = config.capacity()
        self._static = config.plan("scaleshard")
        self._gpus = {name: n * config.tensor_parallel[name] for name, n in config.replicas.items()}
        self._choice = {name: (config.tensor_parallel[name], n) for name, n in config.replicas.items()}
        self._pending: dict[str, tuple[tuple[int, int], float]] = {}
        self.hold_s = hold_s

    def _cost(
        self, tp: int, instances: int, load: float, context: float, clock: float, pending: int, ttft_s: float
    ) -> float | None:
        """Joules per token of `instances` TP`tp` replicas sharing `load` sequences and
        `pending` prompt tokens; None if they would miss the TBT or TTFT target."""
        perf = self._cap.perf
        batch = max(load / instances, 1.0)
        step_s = self._cap.decode_iteration_s(tp, clock, batch, context)
        if step_s > self.config.tbt_s * self.config.headroom or batch * context > perf.kv_capacity_tokens(tp):
            return None
        share = pending // instances
        if share and perf.prefill_time_s(share, share * context, tp, clock) > ttft_s:
            return None
        busy = min(instances, max(load, 1.0))
        step_w = perf.decode_power_w(batch, batch * context, tp, clock)  # a measured curve rises with load
        power = instances * perf.idle_power_w(tp) + busy * tp * (step_w - perf.gpu.idle_w)
        return power / (busy * batch / step_s)

    def _best(self, name: str, dep: DeploymentView) -> tuple[tuple[int, int], bool]:
        """The cheapest feasible (TP, instances), and whether the current choice is feasible."""
        context = self.config.context_tokens(dep.replica_stats)
        clock = float(self.config.clock_mhz[name])
        load = dep.total_load
        pending = sum(s.pending_prompt_tokens for s in dep.replica_stats) + int(dep.queued_outside * context)
        ttft = self.ttft_s.get(name, self.config.tbt_s * 10) * self.config.headroom
        current = self._choice[name]
        best, best_cost = current, math.inf
        current_ok = False
        for tp in self._cap.perf.tensor_parallel_degrees:
            for n in range(1, self._gpus[name] // tp + 1):
                cost = self._cost(tp, n, load, context, clock, pending, ttft)
                current_ok |= cost is not None and (tp, n) == current
                if cost is not None and cost < best_cost:
                    best, best_cost = (tp, n), cost
        return best, current_ok

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        for name, dep in view.deployments.items():
            if name not in self._choice:
                continue
            best, current_ok = self._best(name, dep)
            if best == self._choice[name]:
                self._pending.pop(name, None)
                continue
            # A shape that no longer carries the load is left at once; a cheaper one
            # is taken only after it stayed cheapest for the hold (re-sharding costs).
            if not current_ok:
                self._choice[name] = best
                self._pending.pop(name, None)
                continue
            wanted, since = self._pending.get(name, (best, now_s))
            if wanted != best:
                wanted, since = best, now_s
            self._pending[name] = (wanted, since)
            if now_s - since >= self.hold_s:
                self._choice[name] = best
                self._pending.pop(name, None)
        return self._static.merge(ClusterPlan(
            replicas={n: c[1] for n, c in self._choice.items()},
            tensor_parallel={n: c[0] for n, c in self._choice.items()},
            reason="load",
        ))
