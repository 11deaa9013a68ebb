"""Splitwise's provisioning by simulation (§IV-D): the cheapest (prompt, token) machine
counts whose simulated run meets the SLOs.

The scan is exact, not heuristic: for each number of prompt machines it tries token
counts upward and stops at the first that meets the SLO (more cannot be cheaper), and
it skips every pair already costlier than the best found. It returns what a
brute-force search of the grid returns, after far fewer simulations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Trial:
    prompt: int
    token: int
    cost: float
    meets_slo: bool


def cheapest(
    meets_slo: Callable[[int, int], bool], cost: Callable[[int, int], float], max_prompt: int, max_token: int,
) -> tuple[Trial | None, list[Trial]]:
    """The least-cost pair meeting the SLO (None if none does) and every pair simulated."""
    best: Trial | None = None
    trials: list[Trial] = []
    for p in range(1, max_prompt + 1):
        for t in range(1, max_token + 1):
            c = cost(p, t)
            if best is not None and c >= best.cost:
                break
            trial = Trial(p, t, c, meets_slo(p, t))
            trials.append(trial)
            if trial.meets_slo:
                best = trial
                break
    return best, trials
