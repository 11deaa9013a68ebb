"""The lowest supported clock that passes a check, for every clock search of throttLL'eM's.

Each check (the scoreboard's SLOs, the waiting prompts' TTFTs, a burst's late raise) only
gets easier as the clock rises, so the lowest passing index is a boundary that a bisection
finds. Searches run every step or two on every replica, and the boundary rarely moves
between them: started from the last answer, a search usually ends after two checks (that
index passes, the one below fails) instead of the bisection's seven over 80 clocks.
"""

from __future__ import annotations

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
