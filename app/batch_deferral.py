"""When (and where) deferrable work runs: the cleaner or cheaper slot inside its slack.

A Batch API job may finish any time before its deadline. This planner picks when the queue
releases it, and across regions where: the slot of least carbon intensity (or price) among
those that still leave it `run_allowance_s` before its deadline. After the release,
Chiron's deadline layer sizes the pools to drain the queue by each deadline, as it does
for any job: the deferral only chooses inside the slack, it never spends the time the
deadline layer plans with. Each region takes at most `tokens_per_slot` of deferred work a
slot, so one clean hour does not get every job. Interactive work never comes here.
Pure: times are passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from app.grid_signal import GridSignal, GridSignalConfig, Objective


@dataclass(frozen=True)
class Placement:
    region: str
    release_s: float  # the queue holds the job until then
    slot: int


class DeferralConfig(BaseModel):
    """The Batch API queue's deferral into cleaner or cheaper hours."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=False, description="Hold each Batch API job until the cleanest (or cheapest) slot that still leaves it `run_allowance_s` before its deadline; False: every job runs at once.")
    region: str = Field(default="", description="This app's region: its series in the grid signal (required when enabled).")
    objective: Objective = Field(default="carbon", description="What the slot is chosen by: \"carbon\" (gCO2/kWh) or \"price\" (USD/MWh).")
    grid: GridSignalConfig = Field(default=GridSignalConfig(), description="Where the grid's carbon intensity and price come from.")
    run_allowance_s: float = Field(default=3600.0, gt=0, description="Time a job keeps after its release to run (s): it is released by its deadline minus this, and Chiron's deadline layer sizes the pools to finish it in that time.")
    tokens_per_slot: float | None = Field(default=None, gt=0, description="Most deferred batch tokens (prompt + max_tokens) released into one slot; a slot that is full goes to the next best. None: no limit.")


class DeferralPlanner:
    def __init__(self, signal: GridSignal, objective: Objective = "carbon", run_allowance_s: float = 3600.0,
                 tokens_per_slot: float | None = None, period_slots: int | None = None) -> None:
        """`period_slots`: book slot s and s + period as one (a simulated day that repeats,
        whose work deferred past its end lands in the same hours of the next)."""
        self.signal, self.objective, self.run_allowance_s = signal, objective, run_allowance_s
        self.tokens_per_slot, self.period_slots = tokens_per_slot, period_slots
        self._booked: dict[tuple[str, int], float] = {}

    @classmethod
    def of(cls, config: DeferralConfig, signal: GridSignal) -> DeferralPlanner:
        return cls(signal, config.objective, config.run_allowance_s, config.tokens_per_slot)

    def place(self, submit_s: float, deadline_s: float, cost_tokens: float, regions: Sequence[str]) -> Placement:
        """The job's release (and region: `regions[0]` is its home, preferred on a tie). A job
        with no slack, or whose every later slot is full, is released at once at home."""
        signal = self.signal
        first, last = signal.slot_of(submit_s), signal.slot_of(deadline_s - self.run_allowance_s)
        best: tuple[float, int, int] | None = None
        for slot in range(first, last + 1):
            for order, region in enumerate(regions):
                if self._room(region, slot) < cost_tokens:
                    continue
                here = (signal.at(region, max(submit_s, signal.slot_start_s(slot))).cost(self.objective), slot, order)
                if best is None or here < best:
                    best = here
        if best is None:
            return Placement(regions[0], submit_s, first)
        _, slot, order = best
        key = self._key(regions[order], slot)
        self._booked[key] = self._booked.get(key, 0.0) + cost_tokens
        return Placement(regions[order], max(submit_s, signal.slot_start_s(slot)), slot)

    def forget_before(self, slot: int) -> None:
        """Drop the books of slots gone by (a queue that runs for months)."""
        if self.period_slots is None:
            self._booked = {k: v for k, v in self._booked.items() if k[1] >= slot}

    def _key(self, region: str, slot: int) -> tuple[str, int]:
        return region, slot if self.period_slots is None else slot % self.period_slots

    def _room(self, region: str, slot: int) -> float:
        if self.tokens_per_slot is None:
            return float("inf")
        return self.tokens_per_slot - self._booked.get(self._key(region, slot), 0.0)
