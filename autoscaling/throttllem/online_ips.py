"""throttLL'eM's performance model M learnt online from the engine's own steps, warm-started from
the profile.

M (autoscaling.throttllem.ml_perf_model) is fitted on the profiled engine: the modelled GPU's
steps, which the simulator and the modelled engine run, so there M is the engine's own. A vLLM
replica's engine is another one (another serving stack, GPU or a CPU), and admission and the
clock search project its requests with M. So each vLLM replica starts from M's table for its
shape (the warm start: the profile's times, unchanged until steps come) and corrects it from
the decode steps its engine runs: each step's measured time over the table's for its (batch,
KV blocks, clock) moves the log-ratio of the grid cells around it (bilinear weights). A cell's
correction is its own steps' mean ratio shrunk toward the engine's overall ratio by
`prior_steps` pseudo-steps, so a cell never visited follows the engine's measured speed and one
visited often its own. Every `refresh_steps` steps the corrected table is rebuilt (the profile's
times times the corrections, made monotone in the clock again, no slower at a higher clock, so
the clock searches stay bisections) and handed to the replica's rules. Batch and KV are left as
learnt: lifting a cell to its unvisited neighbours' (the engine's overall ratio) would undo
what its own steps taught.

Pure: steps are passed in.
"""

from __future__ import annotations

import math

import numpy as np

from autoscaling.throttllem.ips_table import IpsTable


class OnlineIpsTable:
    def __init__(self, profile: IpsTable, prior_steps: float, refresh_steps: int) -> None:
        self.profile = profile
        self.prior_steps = prior_steps
        self.refresh_steps = refresh_steps
        self.table = profile  # what admission and the clock rule read
        self.steps = 0
        self._log_ratio_sum = np.zeros_like(profile.iter_s)  # weighted, per grid cell
        self._weight = np.zeros_like(profile.iter_s)
        self._all_log_ratio_sum = 0.0
        self._since_refresh = 0

    def observe(self, batch: int, kv_blocks: int, clock_mhz: float, iteration_s: float) -> None:
        """One decode step of `batch` requests over `kv_blocks` at `clock_mhz` that took
        `iteration_s`."""
        if batch < 1 or iteration_s <= 0:
            return
        clocks = self.profile.clocks_mhz
        clock = min(int(np.searchsorted(clocks, clock_mhz)), len(clocks) - 1)  # the clock or the next supported one
        log_ratio = math.log(iteration_s / self.profile.one_iteration_s(clock, batch, kv_blocks))
        for b, k, weight in self.profile.corners(batch, kv_blocks):
            self._log_ratio_sum[clock, b, k] += weight * log_ratio
            self._weight[clock, b, k] += weight
        self._all_log_ratio_sum += log_ratio
        self.steps += 1
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_steps:
            self._refresh()

    @property
    def speed_ratio(self) -> float:
        """The engine's steps over the profile's, over every step seen (geometric mean)."""
        return math.exp(self._all_log_ratio_sum / self.steps) if self.steps else 1.0

    def _refresh(self) -> None:
        self._since_refresh = 0
        overall = math.log(self.speed_ratio)
        cells = (self._log_ratio_sum + self.prior_steps * overall) / (self._weight + self.prior_steps)
        iter_s = self.profile.iter_s * np.exp(cells)
        iter_s = np.maximum.accumulate(iter_s[::-1], axis=0)[::-1]  # never slower at a higher clock
        self.table = self.profile.with_iteration_times(np.ascontiguousarray(iter_s))
