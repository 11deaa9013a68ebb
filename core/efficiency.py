"""The energy-efficiency figures, defined once for the simulator, Serve, benches and docs.

- J per generated token: the fleet's GPU energy over the window (every replica held,
  idle time included) divided by the output tokens generated in it. Prompt tokens are
  not in the denominator: ML.ENERGY's leaderboard and throttLL'eM count energy per
  output token, and a policy that held idle GPUs must pay for them here.
- Attributed energy of a request (`usage.energy_j` in responses): its share of the steps
  it ran in. Idle power is in no request's share, so attributed energy summed over
  requests is below the fleet's; it answers "what did this request cost", not "what
  does serving cost".
"""

from __future__ import annotations


def joules_per_generated_token(fleet_energy_j: float, generated_tokens: int) -> float:
    return fleet_energy_j / max(generated_tokens, 1)
