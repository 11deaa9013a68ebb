import itertools
import math
from collections.abc import Callable

from autoscaling.throttllem.clock_search import lowest_index_below_zero, lowest_passing_index


def _bisected(lo: int, hi: int, boundary: int) -> int:
    """The answer by plain bisection (no hint)."""
    return lowest_passing_index(lo, hi, lambda i: i >= boundary)


def test_a_hint_never_changes_the_answer() -> None:
    """Every boundary (nothing passes, all pass, in between), every range and every hint,
    inside the range or not: the same index as the bisection without one, `hi` when nothing
    below it passes."""
    for lo, hi in ((0, 0), (0, 1), (0, 7), (3, 12), (0, 79)):
        for boundary in range(lo - 1, hi + 3):
            expected = _bisected(lo, hi, boundary)
            assert expected == min(max(boundary, lo), hi)
            for hint in range(lo - 2, hi + 3):
                assert lowest_passing_index(lo, hi, lambda i, b=boundary: i >= b, hint) == expected


def _counted(boundary: int) -> tuple[list[int], Callable[[int], bool]]:
    """A check passing from `boundary` on, and the indices it was asked about."""
    asked: list[int] = []

    def passes(i: int) -> bool:
        asked.append(i)
        return i >= boundary
    return asked, passes


def test_the_last_answer_as_hint_ends_the_search_in_two_checks() -> None:
    """A boundary that did not move costs two checks (the hint passes, the one below fails),
    against the bisection's seven over 80 clocks; the top costs one."""
    for boundary in (1, 40, 78):
        asked, passes = _counted(boundary)
        assert lowest_passing_index(0, 79, passes, boundary) == boundary
        assert asked == [boundary, boundary - 1]
    asked, passes = _counted(100)  # nothing passes
    assert lowest_passing_index(0, 79, passes, 79) == 79 and asked == [78]
    asked, passes = _counted(40)
    lowest_passing_index(0, 79, passes)
    assert len(asked) == 7


def test_a_moved_boundary_is_still_found_from_a_stale_hint() -> None:
    for boundary, hint in itertools.product((0, 5, 30, 79), (0, 10, 60, 79)):
        assert lowest_passing_index(0, 79, lambda i, b=boundary: i >= b, hint) == boundary


def _margins(boundary: float, shape: str) -> Callable[[int], float]:
    """Non-increasing margins that pass (< 0) above `boundary` and fail at and below it (0 at
    an integer boundary): straight, curved as lateness falls with the clock (elapsed time
    ~ 1 / clock), stepped, or failing by an unknown amount (inf) far below it."""
    def margin(i: int) -> float:
        d = boundary - i
        if shape == "curved":
            return 600.0 / (20.0 + i) - 600.0 / (20.0 + boundary)
        if shape == "stepped":
            return math.floor(d / 3.0) * 3.0 + (0.5 if d >= 0 else -0.5)
        if shape == "unknown below":
            return math.inf if d > 10 else d
        return 0.37 * d
    return margin


def test_margins_never_change_the_answer() -> None:
    """Every boundary, range, hint and margin shape, zero margins (a fail) included: the
    same index as the bisection."""
    for lo, hi in ((0, 0), (0, 1), (0, 7), (3, 12), (0, 79)):
        for boundary in [b + f for b in range(lo - 2, hi + 3) for f in (0.0, 0.25, 0.999)]:
            expected = lowest_passing_index(lo, hi, lambda i, b=boundary: i > b)
            for shape in ("straight", "curved", "stepped", "unknown below"):
                margin = _margins(boundary, shape)
                for hint in [None, *range(lo - 2, hi + 3)]:
                    assert lowest_index_below_zero(lo, hi, margin, hint) == expected


def test_margins_that_fall_steadily_find_a_moved_boundary_in_fewer_checks() -> None:
    """Straight margins place the checks at the crossing: a boundary that moved 1 to 35 clocks
    from the hint costs at most 5 checks (2 when it did not move), where the bisection from the
    same hint takes 6 to 8. Curved or stepped, where the line misses, a check that does not
    halve the bracket is followed by a bisection's: here never more than twice the bisection's."""
    for moved in (0, 1, -1, 3, -3, 6, -6, 10, 15, -20, 30, -35):
        boundary, hint = 40.5 + moved, 41
        counts = {}
        for shape in ("straight", "curved", "stepped"):
            asked: list[int] = []
            shaped = _margins(boundary, shape)

            def margin(i: int, m: Callable[[int], float] = shaped, a: list[int] = asked) -> float:
                a.append(i)
                return m(i)
            assert lowest_index_below_zero(0, 79, margin, hint) == 41 + moved
            counts[shape] = len(asked)
        bisected, passes = _counted(41 + moved)
        lowest_passing_index(0, 79, passes, hint)
        assert counts["straight"] <= (2 if moved == 0 else 5) and (moved == 0 or len(bisected) >= 6), (moved, counts)
        assert max(counts.values()) <= 2 * len(bisected), (moved, counts, len(bisected))
