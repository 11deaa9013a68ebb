"""Ray Serve's own request-based autoscaling as a pure policy: the `serve-autoscaler` baseline.

What a Ray Serve LLM user gets: one deployment per model, replicas scaled on ongoing requests.
Mirrored from Ray 2.60 (the installed `ray` package):
- `ray/serve/autoscaling_policy.py`, `_core_replica_queue_length_policy`: desired replicas =
  running * total_ongoing / (target_ongoing_requests * running), i.e. total / target;
  `_get_cold_start_scale_up_replicas`: a deployment with no running replica and requests waiting
  gets max(ceil(upscaling_factor), its target) at once.
- `_apply_scaling_factors`: ceil(running + factor * (desired - running)); a scale-down stuck at
  the running count by the factor takes one step.
- `_apply_delay_logic`: a scale-up is made once desired stayed above the current target for
  `upscale_delay_s`, a scale-down once it stayed below for `downscale_delay_s` (1 -> 0:
  `downscale_to_zero_delay_s`); the timer restarts when the direction flips or desired equals
  the target, and the decision is the desired count of the tick that ends the wait.
- `ray/serve/_private/autoscaling_state.py`, `get_total_num_requests`: running plus queued
  requests, summed over replicas and handles, averaged over `look_back_period_s`.
- `ray/serve/config.py`, `AutoscalingConfig` defaults: look-back 30 s, upscale delay 30 s,
  downscale delay 600 s, upscaling/downscaling factor 1 (smoothing_factor 1.0); target 2
  ongoing requests (`_private/constants.py`, DEFAULT_TARGET_ONGOING_REQUESTS).

The one parameter an operator must choose is `target_ongoing_requests`: Ray Serve LLM's
default (`ray/llm/_internal/serve/core/server/builder.py`, DEFAULT_DEPLOYMENT_OPTIONS) is
DEFAULT_MAX_TARGET_ONGOING_REQUESTS = 1e9 (`ray/llm/_internal/serve/constants.py`): it never
scales until the operator sets one. The simulator sets it from a load test of one replica
(`sim/load_test.py`), as Serve's autoscaling guide asks; `most_efficient_tp` picks the TP.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from core.plan import ClusterPlan
from core.view import ClusterView, DeploymentView
from energy.capacity import CapacityModel, Load, Operating


class ServeAutoscalerConfig(BaseModel):
    """Ray Serve's AutoscalingConfig fields this policy reads, at Ray 2.60's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_ongoing_requests: dict[str, float] = Field(default_factory=dict, description=(
        "Deployment -> ongoing requests (running and queued) per replica the autoscaler aims at: the "
        "one setting an operator must choose (Ray Serve LLM's default, 1e9, never scales)."))
    default_target_ongoing_requests: float = Field(default=2.0, gt=0, description=(
        "Target of a deployment not named in target_ongoing_requests (Ray Serve's default, 2)."))
    look_back_period_s: float = Field(default=30.0, gt=0, description=(
        "Window the ongoing requests are averaged over (s); Ray Serve's default."))
    upscale_delay_s: float = Field(default=30.0, ge=0, description=(
        "A scale-up is made once it was wanted this long (s); Ray Serve's default."))
    downscale_delay_s: float = Field(default=600.0, ge=0, description=(
        "A scale-down is made once it was wanted this long (s); Ray Serve's default."))
    downscale_to_zero_delay_s: float | None = Field(default=None, ge=0, description=(
        "Delay of a 1 -> 0 scale-down (s); None: downscale_delay_s (Ray Serve's default)."))
    upscaling_factor: float = Field(default=1.0, gt=0, description=(
        "Share of the gap to the desired count a scale-up closes (Ray Serve's default, 1)."))
    downscaling_factor: float = Field(default=1.0, gt=0, description=(
        "Share of the gap to the desired count a scale-down closes (Ray Serve's default, 1)."))
    clock_mhz: dict[str, int] = Field(default_factory=dict, description=(
        "Deployment -> GPU clock its replicas are locked at (the baseline: max clock); "
        "a deployment not named keeps its replicas' own clock."))

    def target(self, deployment: str) -> float:
        return self.target_ongoing_requests.get(deployment, self.default_target_ongoing_requests)


@dataclass
class _Deployment:
    """One deployment's autoscaling state: its look-back samples and a pending decision."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time s, ongoing requests)
    direction: int = 0  # +1 a scale-up is pending, -1 a scale-down, 0 none
    since_s: float | None = None

    def ongoing(self, now_s: float, total: float, look_back_s: float) -> float:
        """Ongoing requests averaged over the look-back window, each reading standing for the
        time since the one before (Serve merges gauge samples into a step function and takes
        its mean over the window: `aggregate_timeseries` with MEAN)."""
        self.samples.append((now_s, total))
        start = now_s - look_back_s
        while len(self.samples) > 2 and self.samples[1][0] <= start:
            self.samples.popleft()
        area = span = 0.0
        for (before, _), (t, value) in zip(self.samples, list(self.samples)[1:]):
            held = t - max(before, start)
            if held > 0:
                area, span = area + value * held, span + held
        return area / span if span > 0 else total


class ServeAutoscalerPolicy:
    """Ray Serve's default autoscaling policy per deployment, its delays kept here (the builder
    sets Serve's own to 0), at the locked clocks of the config."""

    def __init__(self, config: ServeAutoscalerConfig | None = None) -> None:
        self.config = config or ServeAutoscalerConfig()
        self._state: dict[str, _Deployment] = {}

    def _scaled(self, desired: float, running: int) -> int:
        """`_apply_scaling_factors`."""
        if running == 0:
            return math.ceil(desired)
        delta = desired - running
        factor = self.config.upscaling_factor if delta > 0 else self.config.downscaling_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(desired) < running and scaled == running:
            scaled -= 1
        return scaled

    def _delayed(self, state: _Deployment, desired: int, target: int, now_s: float) -> int:
        """`_apply_delay_logic`: the count Serve would set this tick."""
        direction = (desired > target) - (desired < target)
        if direction == 0:
            state.direction, state.since_s = 0, None
            return target
        if direction != state.direction:
            state.direction, state.since_s = direction, now_s
        delay = self.config.upscale_delay_s
        if direction < 0:
            to_zero = self.config.downscale_to_zero_delay_s
            delay = to_zero if target == 1 and to_zero is not None else self.config.downscale_delay_s
            desired = desired if target == 1 else max(1, desired)
        assert state.since_s is not None
        if now_s - state.since_s + 1e-6 >= delay:
            state.direction, state.since_s = 0, None
            return desired
        return target

    def desired_replicas(self, dep: DeploymentView, now_s: float) -> int:
        state = self._state.setdefault(dep.name, _Deployment())
        ongoing = state.ongoing(now_s, dep.total_load, self.config.look_back_period_s)
        target_requests = self.config.target(dep.name)
        running = dep.current_replicas
        if running == 0 and ongoing > 0:  # cold start: at once, no delay
            wanted = max(math.ceil(self.config.upscaling_factor), dep.target_replicas)
        elif running == 0:
            wanted = dep.target_replicas
        else:
            scaled = max(0, self._scaled(ongoing / target_requests, running))
            wanted = self._delayed(state, scaled, dep.target_replicas, now_s)
        return min(max(wanted, dep.min_replicas), dep.max_replicas)

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        replicas = {name: self.desired_replicas(dep, now_s) for name, dep in view.deployments.items()}
        clocks = {name: c for name, c in self.config.clock_mhz.items() if name in view.deployments}
        return ClusterPlan(replicas=replicas, clock_mhz=clocks, reason="serve-autoscaler")


def busiest_operating(cap: CapacityModel, tp: int, clock_mhz: float, shape: Load,
                      tbt_s: float) -> tuple[float, Operating]:
    """The highest arrival rate (requests/s) one replica carries within `tbt_s`, and its steady
    state there: the fluid model's answer to a load test at `shape`'s request sizes."""
    def at(rate: float) -> Operating:
        return cap.operating(tp, clock_mhz, 1, Load(rate, shape.mean_prompt_tokens, shape.mean_output_tokens), tbt_s)

    low, high = 0.0, 1.0
    while at(high).feasible:
        low, high = high, 2 * high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if at(mid).feasible else (low, mid)
    return low, at(low)


def most_efficient_tp(cap: CapacityModel, shape: Load, tbt_s: float) -> int:
    """The profile's TP with the most output tokens per joule at max clock, each replica at the
    busiest load it carries within `tbt_s`."""
    def tokens_per_j(tp: int) -> float:
        rate, op = busiest_operating(cap, tp, cap.perf.gpu.max_clock_mhz, shape, tbt_s)
        return rate * shape.mean_output_tokens / op.power_w if rate > 0 else 0.0

    return max(cap.perf.tensor_parallel_degrees, key=tokens_per_j)
