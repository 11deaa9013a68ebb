"""The energy-efficiency figures, defined once for the simulator, Serve, benches and docs.

- J per generated token: the fleet's GPU energy over the window (every replica held,
  idle time included) divided by the output tokens generated in it. Prompt tokens are
  not in the denominator: ML.ENERGY's leaderboard and throttLL'eM count energy per
  output token, and a policy that held idle GPUs must pay for them here.
- Attributed energy of a request (`usage.energy_j` in responses): its share of the steps
  it ran in. Idle power is in no request's share, so attributed energy summed over
  requests is below the fleet's; it answers "what did this request cost", not "what
  does serving cost". The rest is each replica's idle energy, reported per pool.
- Where a replica's joules come from: its GPUs' energy counter (NVML) on real GPUs, and the
  perf/power model everywhere it has one, side by side (`wattwise_energy_joules{source=...}`).
  A fleet's energy counts each replica once, measured where it is.
"""

from __future__ import annotations


def joules_per_generated_token(fleet_energy_j: float, generated_tokens: int) -> float:
    return fleet_energy_j / max(generated_tokens, 1)


NVML, MODEL = "nvml", "model"  # the sources of a replica's energy figure


def replica_energy_series(series: dict[str, float]) -> dict[str, float]:
    """Of the `wattwise_energy_joules` series scraped (Prometheus labels -> joules), one per
    replica: its GPUs' counter where it has one, else the model's."""
    measured, modelled = f'source="{NVML}"', f'source="{MODEL}"'
    counted = {labels.replace(measured, modelled) for labels in series if measured in labels}
    return {labels: joules for labels, joules in series.items() if measured in labels or labels not in counted}
