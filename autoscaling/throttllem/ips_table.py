"""M tabulated on its bounded feature grid for one TP, so a decision is array indexing.

Every feature of M is bounded for a replica (batch by the batch limit, KV by capacity,
clock by the supported list), so predicting the grid once replaces a model call per
decision (~1 ms each in scikit-learn) with a bilinear lookup in batch and KV at an
exact clock. Clock search then costs a gather and a cumulative sum per probe.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a table is built from M once per machine (replica_policies), then read without it
    from autoscaling.throttllem.ml_perf_model import IpsModel


@dataclass(frozen=True)
class Lookup:
    """Bilinear corners of a (batch, KV) vector as flat indices into one clock's table, with
    their weights: reusable across clocks, since the grid is the same at every clock. It
    belongs to the table that made it, which keeps the iteration times it read per clock."""

    i00: np.ndarray  # (b0, k0)
    i01: np.ndarray  # (b0, k0 + 1)
    i10: np.ndarray  # (b0 + 1, k0)
    i11: np.ndarray  # (b0 + 1, k0 + 1)
    wb: np.ndarray
    wk: np.ndarray
    wb_low: np.ndarray  # 1 - wb
    wk_low: np.ndarray  # 1 - wk
    # IpsTable.iteration_s's answers by clock index (read-only arrays).
    iteration_s: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def shifted(self) -> Lookup:
        """The same vector less its first entry (a projection one iteration on): slices, so
        the iteration times already read carry over, element for element."""
        return Lookup(self.i00[1:], self.i01[1:], self.i10[1:], self.i11[1:], self.wb[1:], self.wk[1:],
                      self.wb_low[1:], self.wk_low[1:], {c: t[1:] for c, t in self.iteration_s.items()})


class IpsTable:
    def __init__(self, model: IpsModel, tp: int, clocks_mhz: list[int], batch_max: int, kv_blocks_max: int,
                 batch_levels: int, kv_levels: int) -> None:
        self.tp = tp
        self.clocks_mhz = np.asarray(sorted(clocks_mhz), dtype=np.float64)
        self.batch_grid = np.unique(np.round(np.geomspace(1, max(batch_max, 2), batch_levels)))
        self.kv_grid = np.linspace(0.0, float(max(kv_blocks_max, 1)), kv_levels)
        c, b, k = np.meshgrid(self.clocks_mhz, self.batch_grid, self.kv_grid, indexing="ij")
        features = np.column_stack([np.full(c.size, tp), b.ravel(), k.ravel(), c.ravel()])
        # Seconds per iteration, clocks x batch levels x KV levels.
        self._set_iteration_times((1.0 / model.predict(features)).reshape(c.shape))
        self._clock_index = {float(c): i for i, c in enumerate(self.clocks_mhz)}
        # Batch and KV blocks are counts and the grids end on integers, so each count's
        # corner and weight are tabulated once: a lookup is a gather (per step, the
        # projection's whole horizon is looked up), and a count past the grid's end
        # clamps to it as the interpolation does.
        b0, self._wb = _corner(self.batch_grid, np.arange(int(self.batch_grid[-1]) + 1, dtype=np.float64))
        self._row = b0 * len(self.kv_grid)
        self._k0, self._wk = _corner(self.kv_grid, np.arange(int(self.kv_grid[-1]) + 1, dtype=np.float64))

    def _set_iteration_times(self, iter_s: np.ndarray) -> None:
        self.iter_s = iter_s
        self._flat_iter_s = iter_s.reshape(len(self.clocks_mhz), -1)
        # The first clock of each run of clocks at which M is the same everywhere on the grid
        # (its trees split on few clock thresholds): a clock search need only try these.
        self.clock_levels = np.flatnonzero(np.r_[True, np.any(self._flat_iter_s[1:] != self._flat_iter_s[:-1], axis=1)])

    def with_iteration_times(self, iter_s: np.ndarray) -> IpsTable:
        """This grid with other seconds per iteration (clocks x batch levels x KV levels): M
        corrected from an engine's steps (autoscaling.throttllem.online_ips). A new table, so
        what was read off this one (Lookup's iteration times) is never taken for it."""
        if iter_s.shape != self.iter_s.shape:
            raise ValueError(f"iteration times of shape {iter_s.shape} for a grid of {self.iter_s.shape}")
        table = copy.copy(self)
        table._set_iteration_times(iter_s)
        return table

    def corners(self, batch: int, kv_blocks: int) -> list[tuple[int, int, float]]:
        """The grid cells (batch level, KV level) that `one_iteration_s` interpolates a
        (batch, KV blocks) count between, with their weights (summing to 1)."""
        b, k = min(batch, len(self._row) - 1), min(kv_blocks, len(self._k0) - 1)
        b0, k0 = int(self._row[b]) // len(self.kv_grid), int(self._k0[k])
        wb, wk = float(self._wb[b]), float(self._wk[k])
        return [(b0, k0, (1 - wb) * (1 - wk)), (b0, k0 + 1, (1 - wb) * wk),
                (b0 + 1, k0, wb * (1 - wk)), (b0 + 1, k0 + 1, wb * wk)]

    def lookup(self, batch: np.ndarray, kv_blocks: np.ndarray) -> Lookup:
        """Corners of integer (batch, KV blocks) counts."""
        b = np.minimum(batch, len(self._row) - 1)
        k = np.minimum(kv_blocks, len(self._k0) - 1)
        i00 = self._row[b] + self._k0[k]
        i10 = i00 + len(self.kv_grid)
        wb, wk = self._wb[b], self._wk[k]
        return Lookup(i00, i00 + 1, i10, i10 + 1, wb, wk, 1 - wb, 1 - wk)

    def clock_index(self, clock_mhz: float) -> int | None:
        """The index of a supported clock; None for one the table does not hold."""
        return self._clock_index.get(clock_mhz)

    def one_iteration_s(self, clock_index: int, batch: int, kv_blocks: int) -> float:
        """`iteration_s` of a single (batch, KV blocks) in scalars (the same arithmetic): the
        step that just ran, read once per step to correct M."""
        b, k = min(batch, len(self._row) - 1), min(kv_blocks, len(self._k0) - 1)
        i00 = int(self._row[b] + self._k0[k])
        i10 = i00 + len(self.kv_grid)
        wb, wk = float(self._wb[b]), float(self._wk[k])
        t = self._flat_iter_s[clock_index]
        low = float(t[i00]) * (1 - wk) + float(t[i00 + 1]) * wk
        high = float(t[i10]) * (1 - wk) + float(t[i10 + 1]) * wk
        return low * (1 - wb) + high * wb

    def iteration_s(self, clock_index: int, at: Lookup) -> np.ndarray:
        """Predicted seconds of each projected iteration at clocks_mhz[clock_index] (kept on
        `at`: the clock searches and the "lost" check read the same clocks step after step)."""
        kept = at.iteration_s.get(clock_index)
        if kept is not None:
            return kept
        t = self._flat_iter_s[clock_index]
        low = t[at.i00] * at.wk_low + t[at.i01] * at.wk
        high = t[at.i10] * at.wk_low + t[at.i11] * at.wk
        at.iteration_s[clock_index] = out = low * at.wb_low + high * at.wb
        return out


def _corner(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower grid index and the interpolation weight of each x (clamped to the grid)."""
    x = np.clip(x, grid[0], grid[-1])
    i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return i, w
