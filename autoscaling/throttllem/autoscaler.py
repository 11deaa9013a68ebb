"""throttLL'eM's engine-size autoscaler as a ControlPolicy (throttLL'eM paper §IV-D).

Every `monitor_interval_s` it picks, per deployment, the smallest TP whose profiled
max load covers the measured requests/s per engine. The runtime shadows the switch
(the old engine serves until the new one is ready: the simulator's reconcile and
Serve's rolling replacement). A new engine gets a grace period equal to its spawn
time during which it may grow but not shrink; the period renews while the measured
load still needs this engine's size, so brief dips never trigger a shadow instance.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaling.throttllem.config import ThrottllemScalingConfig
from core.plan import ClusterPlan
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load


def profiled_max_load_rps(config: ThrottllemScalingConfig) -> dict[int, float]:
    """Highest rate one engine of each TP carries at max clock within the TBT target and the
    KV its admission leaves."""
    perf = default_perf_model(config.model, config.hardware, config.profile)
    cap = CapacityModel(perf, kv_budget=config.kv_budget)
    clock = perf.gpu.max_clock_mhz
    tbt_s = config.tbt_s * config.load_headroom
    out = {}
    for tp in perf.tensor_parallel_degrees:
        lo, hi = 0.0, 1000.0
        for _ in range(40):
            mid = (lo + hi) / 2
            load = Load(mid, config.mean_prompt_tokens, config.mean_output_tokens)
            lo, hi = (mid, hi) if cap.operating(tp, clock, 1, load, tbt_s).feasible else (lo, mid)
        out[tp] = lo
    return out


@dataclass
class EngineState:
    tp: int
    grace_until_s: float


class ThrottllemAutoscaler:
    def __init__(self, config: ThrottllemScalingConfig = ThrottllemScalingConfig()) -> None:
        self.config = config
        profiled = config.max_load_rps or profiled_max_load_rps(config)
        options = set(profiled) if config.tensor_parallel_options is None else set(config.tensor_parallel_options)
        if not options <= set(profiled):
            raise ValueError(f"tensor_parallel_options {sorted(options)}: the max loads have TP{sorted(profiled)} only")
        self.max_load_rps = {tp: load for tp, load in sorted(profiled.items()) if tp in options}
        self._engines: dict[str, EngineState] = {}
        self._next_s = 0.0

    def wanted_tp(self, rps_per_engine: float) -> int:
        """Smallest TP whose max load covers the rate (the largest if none does)."""
        for tp, max_rps in self.max_load_rps.items():
            if rps_per_engine <= max_rps:
                return tp
        return max(self.max_load_rps)

    def _step(self, dep: DeploymentView, now_s: float) -> None:
        current = dep.replica_stats[0].tensor_parallel if dep.replica_stats else max(self.max_load_rps)
        state = self._engines.setdefault(dep.name, EngineState(current, now_s + self.config.spawn_s))
        rps = sum(sum(s.class_rates_per_s.values()) for s in dep.replica_stats) / max(dep.current_replicas, 1)
        wanted = self.wanted_tp(rps)
        if wanted == state.tp:
            state.grace_until_s = now_s + self.config.spawn_s  # renewed: this size is right
        elif wanted > state.tp or now_s >= state.grace_until_s:
            state.tp = wanted
            state.grace_until_s = now_s + self.config.spawn_s

    def observe(self, view: ClusterView, now_s: float) -> ClusterPlan:
        if now_s >= self._next_s:
            self._next_s = now_s + self.config.monitor_interval_s
            for dep in view.deployments.values():
                self._step(dep, now_s)
        return ClusterPlan(tensor_parallel={name: s.tp for name, s in self._engines.items()}, reason="throttllem")
