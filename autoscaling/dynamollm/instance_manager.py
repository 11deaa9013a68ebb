"""Instance manager (DynamoLLM §IV-B, scale-up/down): the GPU clock of each pool.

Filter out clocks whose profiled TTFT/TBT at the current per-instance load miss the
SLO, then pick the one with the least power (at a fixed load, least energy). Replicas
that report gaps over the TBT target push the clock one step up at once: the profile
is a steady-state model and bursts can outrun it.
"""

from __future__ import annotations

from core.slo import SLO
from energy.profile import EnergyProfile


def lowest_energy_clock(
    profile: EnergyProfile, length_class: str, tp: int, rate_per_instance: float, slo: SLO, headroom: float = 0.9
) -> int:
    """Least-power clock meeting the SLO at this load; the highest clock if none does."""
    best: tuple[float, int] | None = None
    for clock in profile.clocks_mhz:
        value = profile.at(length_class, tp, clock, rate_per_instance)
        if value is None or not profile.meets(length_class, tp, clock, rate_per_instance, slo, headroom):
            continue
        if best is None or value[0] < best[0]:
            best = (value[0], clock)
    return best[1] if best else max(profile.clocks_mhz)


def step_up(profile: EnergyProfile, clock_mhz: int) -> int:
    """The next profiled clock above `clock_mhz` (or the top)."""
    higher = [c for c in profile.clocks_mhz if c > clock_mhz]
    return min(higher) if higher else max(profile.clocks_mhz)
