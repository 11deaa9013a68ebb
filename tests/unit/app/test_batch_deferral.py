"""The grid signal (CSV provider) and the deferral of batch work into cleaner slots and regions."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.batch_deferral import DeferralConfig, DeferralPlanner
from app.config import BatchApiConfig
from app.grid_signal import EXAMPLE_CSV, GridPoint, GridSignalConfig, HourlyGridSignal, read_grid_csv

H = 3600.0


def _signal(dirty: list[float], clean: list[float]) -> HourlyGridSignal:
    return HourlyGridSignal({"home": [GridPoint(c, 50.0) for c in dirty],
                             "away": [GridPoint(c, 10.0) for c in clean]})


def test_the_shipped_example_is_two_labelled_synthetic_regions_of_24_hours() -> None:
    series = read_grid_csv(EXAMPLE_CSV)
    assert set(series) == {"solar-west", "wind-north"} and {len(v) for v in series.values()} == {24}
    signal = HourlyGridSignal.from_config(GridSignalConfig())
    assert signal.at("solar-west", 12.5 * H).carbon_g_per_kwh < signal.at("solar-west", 19 * H).carbon_g_per_kwh
    assert signal.at("wind-north", 2 * H) == signal.at("wind-north", 26 * H)  # the day repeats
    with pytest.raises(KeyError, match="no grid series for region 'mars'"):
        signal.at("mars", 0.0)


def test_a_bad_grid_file_names_its_row(tmp_path: Path) -> None:
    bad = tmp_path / "grid.csv"
    bad.write_text("# a comment\nregion,slot,carbon_g_per_kwh,price_usd_per_mwh\nr,0,100,5\nr,2,x,5\n")
    with pytest.raises(ValueError, match="data row 3"):
        read_grid_csv(str(bad))
    bad.write_text("region,slot,carbon_g_per_kwh,price_usd_per_mwh\nr,0,100,5\nr,2,90,5\n")
    with pytest.raises(ValueError, match=r"no row for slots \[1\]"):
        read_grid_csv(str(bad))


def test_a_job_goes_to_the_cleanest_slot_that_leaves_it_its_run_allowance() -> None:
    hours = [400.0] * 24
    hours[5], hours[9] = 100.0, 50.0
    planner = DeferralPlanner(HourlyGridSignal({"home": [GridPoint(c, 0.0) for c in hours]}), run_allowance_s=H)
    # Submitted at 01:30, due at 09:30: 09:00 is cleaner but leaves less than an hour; 05:00 it is.
    placed = planner.place(1.5 * H, 9.5 * H, 100.0, ["home"])
    assert (placed.slot, placed.release_s) == (5, 5 * H)
    assert planner.place(1.5 * H, 20 * H, 100.0, ["home"]).release_s == 9 * H  # more slack: the cleanest
    assert planner.place(1.5 * H, 2.0 * H, 100.0, ["home"]).release_s == 1.5 * H  # no slack: at once


def test_price_and_region_and_a_full_slot() -> None:
    signal = _signal(dirty=[300.0] * 24, clean=[100.0] * 24)
    planner = DeferralPlanner(signal, tokens_per_slot=150.0)
    first = planner.place(0.0, 24 * H, 100.0, ["home", "away"])
    assert (first.region, first.release_s) == ("away", 0.0)  # now, where the grid is cleaner
    assert planner.place(0.0, 24 * H, 100.0, ["home", "away"]).slot == 1  # slot 0 is full there
    by_price = DeferralPlanner(signal, objective="price")
    assert by_price.place(0.0, 24 * H, 1.0, ["home", "away"]).region == "away"
    assert DeferralPlanner(signal).place(0.0, 24 * H, 1.0, ["home"]).region == "home"  # one region: home


def test_a_repeating_day_books_tomorrows_slot_with_todays() -> None:
    planner = DeferralPlanner(_signal([100.0] + [300.0] * 23, [300.0] * 24), tokens_per_slot=100.0,
                              period_slots=24)
    assert planner.place(20 * H, 44 * H, 100.0, ["home"]).slot == 24  # tomorrow's clean hour
    assert planner.place(0.0, 3 * H, 100.0, ["home"]).slot == 1  # today's is the same hour: full


def test_the_app_refuses_a_region_its_grid_signal_does_not_have() -> None:
    with pytest.raises(ValueError, match="'mars' is not in the grid signal"):
        BatchApiConfig(deferral=DeferralConfig(enabled=True, region="mars"))
    assert BatchApiConfig(deferral=DeferralConfig(enabled=True, region="wind-north")).deferral.enabled
