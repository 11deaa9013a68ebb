"""The lowest supported clock that passes a check, for every clock search of throttLL'eM's.

Each check (the scoreboard's SLOs, the waiting prompts' TTFTs, a burst's late raise) only
gets easier as the clock rises, so the lowest passing index is a boundary that a bisection
finds. Searches run every step or two on every replica, and the boundary rarely moves
between them: started from the last answer, a search usually ends after two checks (that
index passes, the one below fails) instead of the bisection's seven over 80 clocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def lowest_passing_index(lo: int, hi: int, passes: Callable[[int], bool], hint: int | None = None) -> int:
    """The lowest index in [lo, hi] at which `passes` (false below some index, true from it
    on) holds, taking `hi` as passing: `hi` when nothing below it passes. `hint`, an index
    near the answer (the last one), is checked first; the answer is the same without it."""
    if hint is not None and lo <= hint <= hi:
        if hint == hi or passes(hint):
            if hint == lo or not passes(hint - 1):
                return hint
            hi = hint - 1
        else:
            lo = hint + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def lowest_index_below_zero(lo: int, hi: int, margin: Callable[[int], float], hint: int | None = None) -> int:
    """`lowest_passing_index` for a check that says by how much it passes or fails: index i
    passes where `margin(i)` < 0 (non-increasing in i; inf where it fails by an unknown
    amount). A boundary that moved far (entries joined or left the batch) costs a bisection
    seven checks; here each check after the hint's is placed where a line through two margins
    crosses zero, and the bracket is bisected next where that did not halve it. The answer is
    the same; where margins fall steadily it costs fewer checks (on the batch mix's slowest 1%
    of steps, 3.2 scoreboard checks a step against 4.0 bisecting the same clock levels)."""
    fail, passing = lo - 1, hi  # the bracket: `fail` fails (lo - 1: nothing known), `passing` passes
    margins: dict[int, float] = {}  # the checks made

    def probe(i: int) -> None:
        nonlocal fail, passing
        margins[i] = m = margin(i)
        if m < 0:
            passing = i
        else:
            fail = i

    if hint is not None and lo <= hint <= hi:  # as lowest_passing_index: the hint, then its neighbour
        if hint < hi:
            probe(hint)
        if passing - fail > 1:
            probe(hint - 1 if passing == hint else hint + 1)
    bisect_next = False  # the last check was placed by the margins and did not halve the bracket
    while passing - fail > 1:
        width = passing - fail
        i = None if bisect_next else _crossing(fail, passing, margins)
        probe((fail + passing + 1) // 2 if i is None else i)
        bisect_next = i is not None and passing - fail > width // 2
    return passing


def _crossing(fail: int, passing: int, margins: dict[int, float]) -> int | None:
    """The first index past zero on a line through two checked margins, kept inside the
    bracket: the bracket's ends where both were checked, else the two checked nearest the end
    that was (extrapolated); None where there is no falling line."""
    if fail in margins and passing in margins:
        a, b = fail, passing
    elif passing in margins:  # everything checked passes: down from the lowest two
        near = sorted(i for i in margins if i >= passing)[:2]
        if len(near) < 2:
            return None
        a, b = near
    elif fail in margins:  # everything checked fails: up from the highest two
        near = sorted(i for i in margins if i <= fail)[-2:]
        if len(near) < 2:
            return None
        a, b = near
    else:
        return None
    m_a, m_b = margins[a], margins[b]
    if not (math.isfinite(m_a) and math.isfinite(m_b)) or m_b >= m_a:
        return None
    x = a + (b - a) * m_a / (m_a - m_b)  # margin 0 on the line
    return min(max(math.floor(x) + 1, fail + 1), passing - 1)
