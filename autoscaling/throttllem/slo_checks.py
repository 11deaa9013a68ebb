"""The scheduler's SLO checks on a projection at one clock (throttLL'eM paper §IV-C2, eqs. 3-4).

T' (seconds per projected iteration) comes from the tabulated model M; the mean of T'
must stay within the TBT target, and each request's finish time, now plus the
cumulative sum of T' up to its last iteration, must fall before its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaling.throttllem.ips_table import IpsTable, Lookup
from autoscaling.throttllem.scoreboard import Projection


@dataclass(frozen=True)
class Verdict:
    tbt_ok: bool
    late: np.ndarray  # per scoreboard entry: projected to finish after its deadline

    def passes(self, ignore: np.ndarray) -> bool:
        """TBT holds and every entry not in `ignore` (lost ones) meets its deadline."""
        return self.tbt_ok and not bool((self.late & ~ignore).any())


def kv_fits(projection: Projection, kv_blocks_total: int) -> bool:
    return len(projection.kv_blocks) == 0 or int(projection.kv_blocks.max()) <= kv_blocks_total


def check(table: IpsTable, clock_index: int, at: Lookup, projection: Projection, deadline_s: np.ndarray,
          now_s: float, tbt_s: float, headroom: float = 1.0) -> Verdict:
    """Checks with every iteration stretched by 1 / headroom (the share of the targets to use)."""
    if len(projection.batch) == 0:
        return Verdict(True, np.zeros(len(deadline_s), dtype=bool))
    iter_s = table.iteration_s(clock_index, at) / headroom
    finish_s = now_s + np.cumsum(iter_s)[projection.remaining - 1]  # eq. 3 read at each entry's end
    return Verdict(float(np.add.reduce(iter_s)) / len(iter_s) <= tbt_s, finish_s >= deadline_s)  # eq. 4


def lowest_passing_clock(table: IpsTable, at: Lookup, projection: Projection, deadline_s: np.ndarray,
                         ignore: np.ndarray, now_s: float, tbt_s: float, headroom: float = 1.0) -> int:
    """Binary search over supported clocks for the lowest index that passes (M is monotone
    in clock); the top index if none does."""
    lo, hi = 0, len(table.clocks_mhz) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if check(table, mid, at, projection, deadline_s, now_s, tbt_s, headroom).passes(ignore):
            hi = mid
        else:
            lo = mid + 1
    return lo
