"""The perf/power model against DynamoLLM's tables, Splitwise's power cap and throttLL'eM's A100
(energy.model_check): fails if the model drifts from the measurements it was fitted to reproduce."""

import numpy as np
import pytest

from energy.calibration import splitwise_perf_model
from energy.clock_fit import BOUNDS, OWN, FitData, a100_loss, power_cap_loss, table_loss, with_physics
from energy.dynamollm_tables import load_tables
from energy.hardware import GPUS
from energy.model_check import (
    THROTTLLEM_SWEET_SPOT_MHZ,
    check_rows,
    counted,
    dynamollm_stack,
    sweet_spot,
    targets,
    throttllem_engine,
)
from energy.profiles import perf_model_for

ROWS = load_tables()


def _checks(stack: bool = True):  # type: ignore[no-untyped-def]
    def sized(model: str):  # type: ignore[no-untyped-def]
        perf = perf_model_for("mlenergy-llama3-70b-h100", model)
        return dynamollm_stack(perf) if stack else perf
    return check_rows({"Llama2-70B": sized("llama2-70b"), "Llama3-70B": sized("llama3.1-70b")}, ROWS)


def test_tables_read_as_the_paper_states_their_argmins() -> None:
    """The text: SS is cheapest at TP2 1.2 GHz, SL at TP4 1.2 GHz, LL (TP8 only) at 1.6 GHz;
    under low load TP4 1.2 GHz, under high load TP4 2.0 GHz."""
    by_label = {r.label: r for r in ROWS}
    argmin = {label: c.measured_argmin for label, c in ((c.row.label, c) for c in _checks())}
    assert argmin["Table I SS"] == (2, "1.2") and argmin["Table I SL"] == (4, "1.2")
    assert argmin["Table I LL"] == (8, "1.6")
    assert argmin["Table II low"] == (4, "1.2") and argmin["Table II high"] == (4, "2.0")
    assert np.isnan(by_label["Table I LL"].energy_wh[:2]).all()  # LL only meets its SLO at TP8


def test_model_reproduces_dynamollm_tables_on_their_stack() -> None:
    """Tables I-II (11 rows): the measured argmin is the model's, or within 3% of its least, in 8;
    E(0.8 GHz)/E(1.2 GHz) within 0.06 in 6 of 9; E(TP8)/E(TP4) at 2.0 GHz within 15% in 8 of 9
    (5 of 9 read as one instance's GPUs, not the server's) and their medians within 15%. The
    issue's targets (9 of 11, every row, every row) are not all met: the model-check results
    file (docs/results) says which rows miss and why."""
    checks = _checks()
    met = targets(checks)
    assert (met.rows, met.low_clock_rows, met.tp_rows) == (11, 9, 9)
    assert met.argmin_rows >= 8
    assert met.low_clock_within >= 6
    assert met.tp_within >= 8
    tp = np.array([c.tp8_over_tp4 for c in counted(checks) if c.tp8_over_tp4])
    assert np.median(tp[:, 1]) == pytest.approx(np.median(tp[:, 0]), rel=0.15)
    # Lower clocks lose at a fixed load, as measured: 0.8 GHz costs more than 1.2 GHz in every row.
    assert all(c.low_clock_ratio[1] > 1.05 for c in checks if c.low_clock_ratio)


def test_held_out_rows() -> None:
    """Not fitted on: Table III's Llama3-70B row (the default profile's own model) and Table II's
    low and high loads."""
    checks = {c.row.label: c for c in _checks()}
    llama3 = checks["Table III Llama3-70B"]
    assert llama3.argmin_ok and llama3.spearman > 0.8
    measured, modelled = llama3.low_clock_ratio
    assert abs(modelled - measured) < 0.06
    for label in ("Table II low", "Table II high"):
        measured, modelled = checks[label].low_clock_ratio
        assert abs(modelled - measured) < 0.06


def test_todays_stack_still_pays_for_the_lowest_clock() -> None:
    """On the default profile's own stack (2026 vLLM: 10-19 ms less overhead per step) 0.8 GHz
    still costs the server more than 1.2 GHz at the tables' loads: 3-10% where decode dominates
    (9-19% on DynamoLLM's stack), more where prefill does (LS: 24%)."""
    today = [c for c in _checks(stack=False) if c.low_clock_ratio and np.isfinite(c.low_clock_ratio[1])]
    assert len(today) == 12 and all(c.low_clock_ratio[1] > 1.02 for c in today)  # Tables I-III


def test_a100_sweet_spot_within_one_step_of_throttllems() -> None:
    """Held out of the A100's fit (its TBT and tokens/J at 1,050 MHz): where tokens/J peak."""
    spot = sweet_spot(throttllem_engine())
    assert abs(spot.clock_mhz - THROTTLLEM_SWEET_SPOT_MHZ) <= 105
    assert spot.efficiency_gain == pytest.approx(1.374, rel=0.02)


def test_the_gpus_physics_are_the_fits_optimum() -> None:
    """The clock constants in energy.hardware are where energy.clock_fit leaves them: moving any
    one by 3% of its range does not lower the fit's loss (no hand-edited constant)."""
    data = FitData(dynamollm_stack(perf_model_for("mlenergy-llama3-70b-h100", "llama2-70b")),
                   [r for r in ROWS if r.table == "I"], splitwise_perf_model("llama2-70b", "h100-80gb"),
                   throttllem_engine())
    h100, a100 = GPUS["h100-80gb"], GPUS["a100-80gb"]

    def loss(h: dict[str, float], a: dict[str, float]) -> float:
        return (table_loss(with_physics(data.dynamollm, h), data.rows) + 4.0 * power_cap_loss(
            with_physics(data.capped, h)) + 10.0 * a100_loss(with_physics(data.a100, a)))

    fitted_h = {n: getattr(h100, n) for n in BOUNDS}
    fitted_a = {n: getattr(a100, n) for n in BOUNDS}
    assert {n: fitted_a[n] for n in BOUNDS if n not in OWN} == {n: fitted_h[n] for n in BOUNDS if n not in OWN}
    base = loss(fitted_h, fitted_a)
    for name, (low, high) in BOUNDS.items():
        for sign in (-1, 1):
            step = sign * 0.03 * (high - low)
            h = dict(fitted_h, **{name: min(max(fitted_h[name] + step, low), high)})
            a = dict(fitted_a, **{name: min(max(fitted_a[name] + step, low), high)}) if name not in OWN else fitted_a
            assert loss(h, a) >= base - 1e-3, (name, sign)
