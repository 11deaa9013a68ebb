"""The held-out count over orders of the coding trace's minutes."""

from bench.shuffled_orders import seed_range, tally


def _run(**classes: float) -> dict:
    return {"slo_attainment": {"overall": min(classes.values()), "interactive": 1.0, **classes}}


def test_seed_ranges_and_lists() -> None:
    assert seed_range("1-4") == [1, 2, 3, 4]
    assert seed_range("1,8,9") == [1, 8, 9]
    assert seed_range("3,7-8") == [3, 7, 8]


def test_an_order_misses_when_its_worst_class_does_whatever_the_overall_figure() -> None:
    by_seed = {
        1: (_run(SS=0.97, LL=1.0), _run(SS=1.0, LL=0.985)),  # both miss a class; ours is higher
        2: (_run(SS=0.995, LL=1.0), _run(SS=1.0, LL=0.999)),  # neither misses
        3: (_run(SS=0.98, LL=1.0), _run(SS=0.97, LL=1.0)),  # ours misses by more
    }
    counts = tally(by_seed)
    assert counts.missed_by_composite == [1, 3]
    assert counts.missed_by_singlepool == [1, 3]
    assert counts.composite_worst_class_above == 2
