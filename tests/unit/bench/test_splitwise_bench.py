from bench.splitwise import iso_power_budget_kw, search, searches


def test_parallel_searches_find_what_each_search_finds_alone():
    """Each (trace, design) searches in its own process; the table reads them by key, so a
    mix-up (or a search that depends on another's runs) would show as a different point."""
    found = searches(["conv"], ["base-H", "HH"], 10.0, 0, 2.0, jobs=2)
    assert set(found) == {("conv", "base-H"), ("conv", "HH")}
    for (trace, design), got in found.items():
        alone = search(trace, design, 10.0, 0, 2.0)
        assert got.best is not None and alone.best is not None
        assert (got.best.design, got.best.prompt, got.best.token) == (alone.best.design, alone.best.prompt,
                                                                      alone.best.token)
        assert got.best.rate_rps == alone.best.rate_rps
        assert got.best.power_kw <= iso_power_budget_kw(2.0) + 1e-9
    assert (found[("conv", "base-H")].best.prompt, found[("conv", "HH")].best.token) == (2, 1)
