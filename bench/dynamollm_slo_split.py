"""Diverse SLOs (DynamoLLM §III "Service SLO"): one pool at the strictest SLO, or one
pool per service? Separate pools only when they use less energy.

Services sharing a model and a length class can differ in SLO (5x, 10x, 20x of the
unloaded latency). A looser service alone may run at lower clocks or smaller TP, but
separating fragments GPUs; the pool manager's MILP prices both ways on the profile.
A reproduction of the paper's section, not a product layer: no policy serves diverse SLOs
per length class yet, so it lives beside the benches.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaling.dynamollm.pool_manager import solve_pool
from core.slo import SLO
from energy.profile import EnergyProfile


@dataclass(frozen=True)
class SplitDecision:
    separate: bool
    shared_power_w: float | None
    separate_power_w: float | None


def should_split(
    profile: EnergyProfile, length_class: str, loads_per_s: dict[str, float], slos: dict[str, SLO], gpus: int
) -> SplitDecision:
    """Compare one pool at the tightest SLO with one pool per service; each option takes
    only the GPUs it needs (up to `gpus` in total), so idle GPUs favour neither."""
    strictest = SLO(ttft_s=min(s.ttft_s for s in slos.values()), tbt_s=min(s.tbt_s for s in slos.values()))
    shared = _smallest_pool(profile, length_class, sum(loads_per_s.values()), strictest, gpus)
    separate_w: float | None = None  # None: the services do not fit apart
    total_w = 0.0
    gpus_left = gpus
    for service, load in sorted(loads_per_s.items(), key=lambda kv: -kv[1]):
        choice = _smallest_pool(profile, length_class, load, slos[service], gpus_left)
        if choice is None:
            break
        total_w += choice[1]
        gpus_left -= choice[0]
    else:
        separate_w = total_w
    shared_w = shared[1] if shared else None
    separate = separate_w is not None and (shared_w is None or separate_w < shared_w)
    return SplitDecision(separate, shared_w, separate_w)


def _smallest_pool(profile: EnergyProfile, cls: str, load: float, slo: SLO, max_gpus: int) -> tuple[int, float] | None:
    """(GPUs, power) of the cheapest pool carrying `load`, trying pool sizes upward."""
    best = None
    for gpus in range(min(profile.tensor_parallel_degrees), max_gpus + 1, min(profile.tensor_parallel_degrees)):
        choice = solve_pool(profile, cls, load, gpus, slo)
        if choice is not None and (best is None or choice.power_w < best[1]):
            best = (gpus, choice.power_w)
    return best
