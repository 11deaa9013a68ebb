"""The scheduler's SLO checks on a projection at one clock (throttLL'eM paper §IV-C2, eqs. 3-4).

T' (seconds per projected iteration) comes from the tabulated model M; the mean of T'
must stay within the TBT target, and each request's finish time, now plus the
cumulative sum of T' up to its last iteration, must fall before its deadline.
The projected end is an upper bound (predicted lengths are stretched by the predictor's
error) and most requests end sooner, while the batch is still full and its iterations
slow: for the clock search, a deadline that grows by the TBT target per token holds at
every token up to the projected end, not at the end alone, or the search picks clocks
that meet the stretched ends and miss the real ones. Admission and "lost" ask whether a
request can be served at all at max clock, and keep eq. 3 at the end (`at_ends`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaling.throttllem.clock_search import lowest_index_below_zero
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


@dataclass(frozen=True)
class _PerTokenGroup:
    """The entries whose deadline moves `per_token` seconds per token, read at every token."""

    rows: np.ndarray  # indices into the scoreboard
    last: np.ndarray  # each row's last projected iteration (remaining - 1)
    per_token_k: np.ndarray  # per_token * k for k = 1 .. the rows' longest remaining
    bound_s: np.ndarray  # deadline_s - per_token * remaining: "now + elapsed - per_token * k" must stay below


@dataclass(frozen=True)
class DeadlineLines:
    """Every entry's deadline wherever it ends: deadline_s at its projected end, per_token
    seconds earlier per token before it. Built once per projection, since the clock search
    reads it at each clock it tries."""

    last: np.ndarray  # remaining - 1 per entry
    end_s: np.ndarray
    groups: tuple[_PerTokenGroup, ...]

    @classmethod
    def build(cls, remaining: np.ndarray, deadline_s: np.ndarray, per_token_s: np.ndarray) -> DeadlineLines:
        groups = []
        positive = per_token_s[per_token_s > 0]
        # Usually one value (every class's TBT target alike): no sort for it.
        values = positive[:1] if len(positive) and (positive == positive[0]).all() else np.unique(positive)
        for per_token in values:
            rows = np.flatnonzero(per_token_s == per_token)
            r = remaining[rows]
            groups.append(_PerTokenGroup(rows, r - 1, per_token * np.arange(1, int(r.max()) + 1),
                                         deadline_s[rows] - per_token * r))
        return cls(remaining - 1, deadline_s, tuple(groups))

    @classmethod
    def at_ends(cls, remaining: np.ndarray, deadline_s: np.ndarray) -> DeadlineLines:
        """Each deadline read at its projected end only (eq. 3)."""
        return cls(remaining - 1, deadline_s, ())

    def late(self, elapsed_s: np.ndarray, now_s: float) -> np.ndarray:
        """Per entry: some token k ends (at now + elapsed_s[k - 1]) after its deadline for
        ending there. Per token 0: the end binds (eq. 3); otherwise the worst k is a running
        maximum of elapsed_s[k - 1] - per_token * k."""
        late = now_s + elapsed_s[self.last] >= self.end_s
        for g in self.groups:
            late[g.rows] |= self._group_late(g, elapsed_s, now_s)
        return late

    def margin_s(self, elapsed_s: np.ndarray, now_s: float, ignore: np.ndarray | None,
                 every_token: bool = True) -> float:
        """How late the latest entry not in `ignore` (None: none ignored) would be, in seconds:
        >= 0 exactly where `late(...) & ~ignore` has an entry (at the ends alone unless
        `every_token`). The clock search's question, and how far it is from the answer."""
        late_s = now_s + elapsed_s[self.last] - self.end_s  # the sign of "now + elapsed >= end"
        worst = _latest(late_s, ignore)
        if every_token and worst < 0:
            for g in self.groups:
                rows_ignored = None if ignore is None else ignore[g.rows]
                worst = max(worst, _latest(now_s + self._group_worst(g, elapsed_s) - g.bound_s, rows_ignored))
        return worst

    @staticmethod
    def _group_worst(g: _PerTokenGroup, elapsed_s: np.ndarray) -> np.ndarray:
        """Per row: the largest elapsed_s[k - 1] - per_token * k up to its last iteration."""
        return np.maximum.accumulate(elapsed_s[:len(g.per_token_k)] - g.per_token_k)[g.last]

    @classmethod
    def _group_late(cls, g: _PerTokenGroup, elapsed_s: np.ndarray, now_s: float) -> np.ndarray:
        return now_s + cls._group_worst(g, elapsed_s) >= g.bound_s


def _latest(late_s: np.ndarray, ignore: np.ndarray | None) -> float:
    if ignore is not None:
        late_s = np.where(ignore, -np.inf, late_s)
    return float(late_s.max()) if len(late_s) else -math.inf


def check(table: IpsTable, clock_index: int, at: Lookup, projection: Projection, lines: DeadlineLines,
          now_s: float, tbt_s: float, headroom: float = 1.0) -> Verdict:
    """Checks with every iteration stretched by 1 / headroom (the share of the targets to use)."""
    if len(projection.batch) == 0:
        return Verdict(True, np.zeros(len(lines.end_s), dtype=bool))
    iter_s = table.iteration_s(clock_index, at) / headroom
    late = lines.late(np.cumsum(iter_s), now_s)
    return Verdict(float(np.add.reduce(iter_s)) / len(iter_s) <= tbt_s, late)  # eq. 4


def late_entries(table: IpsTable, clock_index: int, at: Lookup, projection: Projection, lines: DeadlineLines,
                 now_s: float, headroom: float = 1.0) -> np.ndarray:
    """`check(...).late` alone (eq. 3), for a caller that does not read the TBT mean."""
    if len(projection.batch) == 0:
        return np.zeros(len(lines.end_s), dtype=bool)
    return lines.late(np.cumsum(table.iteration_s(clock_index, at) / headroom), now_s)


def lowest_passing_clock(table: IpsTable, at: Lookup, projection: Projection, lines: DeadlineLines,
                         ignore: np.ndarray, now_s: float, tbt_s: float, headroom: float = 1.0,
                         hint: int | None = None) -> int:
    """The lowest supported clock index that passes (M is monotone in clock); the top index
    if none does. Searched from `hint`, the last answer, each check placed by the margins of the
    ones before (clock_search.lowest_index_below_zero). The ends alone first
    (cheap): the clock that holds every token is at or above the one that holds the ends, and
    usually the same."""
    elapsed: dict[int, np.ndarray | None] = {}  # by clock index: None where the TBT mean fails
    ignored = ignore if ignore.any() else None

    def margin_s(clock_index: int, every_token: bool) -> float:  # < 0 exactly where check(...).passes(ignore)
        if len(projection.batch) == 0:
            return -math.inf
        if clock_index not in elapsed:  # the ends and every token read the same clocks
            iter_s = table.iteration_s(clock_index, at) / headroom
            elapsed[clock_index] = None if float(np.add.reduce(iter_s)) / len(iter_s) > tbt_s else np.cumsum(iter_s)
        cumulative = elapsed[clock_index]
        return math.inf if cumulative is None else lines.margin_s(cumulative, now_s, ignored, every_token)

    # By level: the first clock of each run at which M is the same (clock_levels), then the top
    # clock (level `top_level`, taken as passing as lowest_passing_index takes its `hi`). Every
    # clock of a run checks alike, so the lowest passing clock is a level's.
    levels, top = table.clock_levels, len(table.clocks_mhz) - 1
    top_level = len(levels)

    def clock(level: int) -> int:
        return int(levels[level]) if level < top_level else top

    def level_of(clock_index: int) -> int:
        return int(np.searchsorted(levels, clock_index, side="right")) - 1

    hint_level = None if hint is None else level_of(hint)
    ends = clock(lowest_index_below_zero(0, top_level, lambda j: margin_s(clock(j), every_token=False), hint_level))
    if ends == top or not lines.groups or margin_s(ends, every_token=True) < 0:
        return ends
    return clock(lowest_index_below_zero(level_of(ends) + 1, top_level, lambda j: margin_s(clock(j), every_token=True),
                                         hint_level))
