"""Chiron's theta from the arrival history (Chiron §5: "chosen based on historic arrival
patterns ... if the tail request arrival spike is three times the average arrival rate,
theta is set to 1/3").

Theta is the share of interactive + mixed replicas that interactive work may keep busy;
the rest is the spare capacity a spike lands on before a new instance can start. So the
spike is measured over windows as long as an instance takes to start: a shorter burst
must be absorbed, a longer one the autoscaler can answer.
"""

from __future__ import annotations

import numpy as np

# Theta stays inside (0, 1) (ChironConfig's bounds): at least 5% spare capacity even for a
# perfectly flat history, at most 20x over-provisioning for the burstiest.
_THETA_MIN, _THETA_MAX = 0.05, 0.95


def theta_from_arrivals(arrival_s: np.ndarray, window_s: float, percentile: float = 99.0) -> float:
    """Mean arrival rate over the `percentile`-th percentile rate of `window_s` windows
    (1/3 when the tail spike is three times the mean); 1/3, the paper's default, with no
    history to read."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    arrivals = np.asarray(arrival_s, dtype=np.float64)
    if len(arrivals) == 0:
        return 1 / 3
    start = float(arrivals.min())
    counts = np.bincount(((arrivals - start) // window_s).astype(np.int64))
    spike = float(np.percentile(counts, percentile))
    return float(np.clip(counts.mean() / spike, _THETA_MIN, _THETA_MAX))
