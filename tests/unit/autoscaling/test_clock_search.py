import itertools
from collections.abc import Callable

from autoscaling.throttllem.clock_search import lowest_passing_index


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
