"""Finished interactive requests per length class over a trailing window, and how many met
their SLO: what a replica reports for the controller's SLO guard (autoscaling.slo_guard).

A request meets its SLO as the simulator's reports judge it (sim.metrics.slo_met): it
completed, its TTFT is within its target and its mean gap between tokens after the first
is within its TBT target. Batch work is not counted: its targets are hours.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from core.slo import SLO


def mean_tbt_s(first_token_s: float, last_token_s: float, generated: int) -> float:
    """The mean gap between a request's tokens after its first (0 for a single token)."""
    return (last_token_s - first_token_s) / (generated - 1) if generated > 1 else 0.0


def slo_met(slo: SLO, ttft_s: float, tbt_s: float) -> bool:
    """Whether a completed request with this TTFT and mean TBT met `slo`."""
    return ttft_s <= slo.ttft_s and tbt_s <= slo.tbt_s


@dataclass(frozen=True)
class ClassOutcomes:
    """Per length class: interactive requests completed in the window, and those that met their SLO."""

    completed: dict[str, int]
    met: dict[str, int]


class SloOutcomes:
    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._finished: deque[tuple[float, str, bool]] = deque()

    def add(self, now_s: float, length_class: str, met: bool) -> None:
        self._finished.append((now_s, length_class, met))

    def counts(self, now_s: float) -> ClassOutcomes:
        while self._finished and self._finished[0][0] < now_s - self.window_s:
            self._finished.popleft()
        return ClassOutcomes(completed=dict(Counter(c for _, c, _ in self._finished)),
                             met=dict(Counter(c for _, c, met in self._finished if met)))
