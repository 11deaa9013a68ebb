"""bench.carbon's day: batch work placed by the deferral planner, wrapped into one repeating day."""

import numpy as np

from app.batch_deferral import DeferralPlanner
from app.grid_signal import GridSignalConfig, HourlyGridSignal
from bench.carbon import DAY_S, RUN_ALLOWANCE_S, WINDOW_S, region_days


def test_deferred_batch_work_lands_in_clean_hours_within_its_window_and_interactive_work_stays() -> None:
    signal = HourlyGridSignal.from_config(GridSignalConfig())
    regions = list(signal.regions)
    plain = region_days(regions, 0.02, 0.3, 0, None)
    deferred = region_days(regions, 0.02, 0.3, 0, DeferralPlanner(signal, period_slots=24))
    for before, after in zip(plain, deferred):
        assert np.array_equal(np.sort(before.workload.arrival_s[before.workload.interactive]),
                              np.sort(after.workload.arrival_s[after.workload.interactive]))  # never deferred
    batch = [(d.region, d.submit_s[i], d.release_s[i], d.workload.arrival_s[i]) for d in deferred
             for i in np.flatnonzero(~d.workload.interactive)]
    assert len(batch) == sum(int((~d.workload.interactive).sum()) for d in plain)  # none lost, none doubled
    assert all(s <= r <= s + WINDOW_S - RUN_ALLOWANCE_S for _, s, r, _ in batch)
    assert all(0 <= a < DAY_S and a == r % DAY_S for _, _, r, a in batch)  # the day repeats

    def intensity(rows):
        return np.mean([signal.at(region, release).carbon_g_per_kwh for region, _, release, _ in rows])

    undeferred = [(d.region, d.submit_s[i], d.release_s[i], 0.0) for d in plain for i in np.flatnonzero(
        ~d.workload.interactive)]
    assert intensity(batch) < 0.6 * intensity(undeferred)
