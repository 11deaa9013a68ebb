"""Two runs of the same requests side by side: latency percentiles and their relative error.

The live-vs-simulated bench judges the simulator by it: each metric at each percentile,
the simulated value's error relative to the live one, and whether it is within a target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METRICS = (("TTFT", "ttft_s"), ("mean TBT", "mean_tbt_s"), ("E2E", "e2e_s"))
PERCENTILES = (50, 90)


@dataclass(frozen=True)
class RequestLatency:
    """What one request took, as its client saw it (live) or as the simulator modelled it."""

    ttft_s: float
    mean_tbt_s: float  # the mean gap between tokens after the first
    e2e_s: float


@dataclass(frozen=True)
class Cell:
    """One metric at one percentile in both runs."""

    metric: str
    percentile: int
    live_s: float
    sim_s: float

    @property
    def relative_error(self) -> float:
        """Signed: above 0 the simulator is slower than the live run."""
        return (self.sim_s - self.live_s) / self.live_s

    def within(self, target: float) -> bool:
        return abs(self.relative_error) <= target


def compare(live: Sequence[RequestLatency], sim: Sequence[RequestLatency]) -> list[Cell]:
    """Percentiles of each metric over the same requests, in METRICS x PERCENTILES order."""
    if len(live) != len(sim) or not live:
        raise ValueError(f"need the same non-empty set of requests in both runs; have {len(live)} and {len(sim)}")
    cells = []
    for name, field in METRICS:
        live_values = np.array([getattr(r, field) for r in live])
        sim_values = np.array([getattr(r, field) for r in sim])
        for p in PERCENTILES:
            cells.append(Cell(name, p, float(np.percentile(live_values, p)), float(np.percentile(sim_values, p))))
    return cells


def markdown_table(cells: Sequence[Cell], target: float, sim_label: str = "sim") -> str:
    """The cells as a Markdown table (milliseconds), with the target's verdict per cell."""
    lines = [f"| metric | percentile | live ms | {sim_label} ms | relative error | within {target:.0%} |",
             "| --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        lines.append(f"| {c.metric} | p{c.percentile} | {c.live_s * 1000:,.1f} | {c.sim_s * 1000:,.1f} | "
                     f"{c.relative_error:+.1%} | {'yes' if c.within(target) else 'no'} |")
    met = sum(c.within(target) for c in cells)
    lines.append(f"\n{met} of {len(cells)} cells within {target:.0%}.")
    return "\n".join(lines)
