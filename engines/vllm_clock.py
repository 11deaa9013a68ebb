"""The clock a vLLM replica asks its GPUs for, and what it knows of their lag.

The simulated replicas' batcher models its GPUs' clock; a vLLM replica has real ones,
reached only through its node's GPU-control actor (deployments.gpu_actor): its clock rule
(throttLL'eM's, the one the batcher runs) picks a clock inside the planner's band at each
engine step, the replica forwards the latest choice every `clock_forward_period_s` and
reads back the clock the GPUs run at. A rule planning a raise reads when a choice made
now lands by the rule the batcher models (core.overheads.clock_lands_s), and the clock
running meanwhile: the one read back, else the last chosen, else the driver's default
(the top clock: an unlocked GPU boosts).
"""

from __future__ import annotations

from core.overheads import OverheadTable, clock_lands_s
from energy.hardware import GpuSpec

OVERHEADS = OverheadTable()  # the lag every runtime charges a clock change (core.overheads)


class VllmClock:
    def __init__(self, gpu: GpuSpec, overheads: OverheadTable = OVERHEADS) -> None:
        self.gpu = gpu
        self.overheads = overheads
        self.band_mhz: tuple[float, float] | None = None  # the planner's bounds (None: the GPU's range)
        self.requested_mhz = 0.0  # the latest choice, which the replica forwards (0: none, driver default)
        self.applied_mhz: float | None = None  # what the GPUs run at, as last read back

    @property
    def target_mhz(self) -> float:
        """The latest choice; the driver's default (top) clock before any."""
        return self.requested_mhz or float(self.gpu.max_clock_mhz)

    @property
    def running_mhz(self) -> float:
        """What the GPUs run at: read back where known, else the latest choice."""
        return self.applied_mhz if self.applied_mhz is not None else self.target_mhz

    def request(self, clock_mhz: float) -> None:
        """Choose a clock (within the GPU's range); the replica forwards it."""
        self.requested_mhz = float(min(max(clock_mhz, self.gpu.min_clock_mhz), self.gpu.max_clock_mhz))

    def set_band(self, low_mhz: float, high_mhz: float, has_rule: bool) -> None:
        """The planner's band: a replica with a clock rule moves its choice into it (the
        rule searches inside it from the next step), one without runs at its floor."""
        if low_mhz > high_mhz:
            raise ValueError(f"clock band [{low_mhz}, {high_mhz}] MHz is empty")
        self.band_mhz = (float(low_mhz), float(high_mhz))
        self.request(self.clamp_to_band(self.target_mhz) if has_rule else low_mhz)

    def clamp_to_band(self, clock_mhz: float) -> float:
        if self.band_mhz is None:
            return clock_mhz
        low, high = self.band_mhz
        return min(max(clock_mhz, low), high)

    def lands_s(self, now_s: float) -> float:
        return clock_lands_s(now_s, self.overheads.clock_forward_period_s, self.overheads.clock_change_s)

    @property
    def longest_lag_s(self) -> float:
        """The longest a choice waits to reach the GPUs: made just after a forward."""
        return self.lands_s(0.0) + self.overheads.clock_forward_period_s
