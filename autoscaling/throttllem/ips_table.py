"""M tabulated on its bounded feature grid for one TP, so a decision is array indexing.

Every feature of M is bounded for a replica (batch by the batch limit, KV by capacity,
clock by the supported list), so predicting the grid once replaces a model call per
decision (~1 ms each in scikit-learn) with a bilinear lookup in batch and KV at an
exact clock. Clock search then costs a gather and a cumulative sum per probe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaling.throttllem.ml_perf_model import IpsModel


@dataclass(frozen=True)
class Lookup:
    """Bilinear corners and weights of a (batch, KV) vector, reusable across clocks."""

    b0: np.ndarray
    k0: np.ndarray
    wb: np.ndarray
    wk: np.ndarray


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
        self.iter_s = (1.0 / model.predict(features)).reshape(c.shape)

    def lookup(self, batch: np.ndarray, kv_blocks: np.ndarray) -> Lookup:
        b0, wb = _corner(self.batch_grid, batch)
        k0, wk = _corner(self.kv_grid, kv_blocks)
        return Lookup(b0, k0, wb, wk)

    def iteration_s(self, clock_index: int, at: Lookup) -> np.ndarray:
        """Predicted seconds of each projected iteration at clocks_mhz[clock_index]."""
        t = self.iter_s[clock_index]
        b0, k0, wb, wk = at.b0, at.k0, at.wb, at.wk
        low = t[b0, k0] * (1 - wk) + t[b0, k0 + 1] * wk
        high = t[b0 + 1, k0] * (1 - wk) + t[b0 + 1, k0 + 1] * wk
        return low * (1 - wb) + high * wb


def _corner(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower grid index and the interpolation weight of each x (clamped to the grid)."""
    x = np.clip(x, grid[0], grid[-1])
    i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return i, w
