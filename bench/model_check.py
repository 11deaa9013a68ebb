"""The perf/power model beside every measurement it must reproduce, row by row.

    wattwise bench model-check [--refit] [--leave-one-out]

Prints, per DynamoLLM table row (Tables I-III, energy.model_check): the measured and modelled
least-energy (TP, clock), E(0.8 GHz)/E(1.2 GHz), E(TP8)/E(TP4) at 2.0 GHz, the Spearman rank
over the row's cells and the shape error; once on the stack DynamoLLM measured (the default
profile plus the step overhead Splitwise measured on it), once on the default profile's own
stack, once with the tables' loads read as input tokens alone. Then throttLL'eM's A100 sweet
spot, Splitwise's power-capped H100 and the TP law's fit. --refit fits the clock physics again
(energy.clock_fit, ~1 min) and prints the GpuSpec values; --leave-one-out refits without each
of the fit's three measurements in turn and prints the targets each refit meets.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import numpy as np

from energy.calibration import power_cap_report, splitwise_perf_model
from energy.clock_fit import FIT_ROWS, FitData, fit_clock_physics, with_physics
from energy.dynamollm_tables import MeasuredRow, load_tables
from energy.hardware import GPUS
from energy.model_check import (
    THROTTLLEM_SWEET_SPOT_MHZ,
    RowCheck,
    Targets,
    check_rows,
    counted,
    dynamollm_stack,
    sweet_spot,
    targets,
    throttllem_engine,
)
from energy.perf_model import PerfModel
from energy.profiles import default_profile, perf_model_for
from energy.tp_scaling import fit_tp_scaling

PROFILE = default_profile("llama2-70b", "h100-80gb") or "splitwise-llama2-70b-h100"
SIZED = {"Llama2-70B": "llama2-70b", "Llama3-70B": "llama3.1-70b"}


def _ratio(pair: tuple[float, float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.2f} / {pair[1]:.2f}"


def print_rows(title: str, checks: list[RowCheck]) -> None:
    print(f"\n{title}")
    print(f"{'row':<24} {'argmin measured':>16} {'model':>10} {'ok':>3} {'E0.8/E1.2 meas/model':>22} "
          f"{'E8/E4 meas/model':>17} {'Spearman':>9} {'shape':>6}")
    for c in checks:
        tp, ghz = c.measured_argmin
        model = c.model_argmin
        shown = "-" if model is None else f"TP{model[0]} {model[1]}"
        print(f"{c.row.label:<24} {f'TP{tp} {ghz}':>16} {shown:>10} {'yes' if c.argmin_ok else 'no':>3} "
              f"{_ratio(c.low_clock_ratio):>22} {_ratio(c.tp8_over_tp4):>17} {c.spearman:>9.2f} {c.shape_error:>6.3f}")
    print_targets(targets(checks))


def print_targets(t: Targets) -> None:
    print(f"targets (Tables I-II): argmin {t.argmin_rows}/{t.rows} (target >= 9); E(0.8)/E(1.2) within 0.06 "
          f"{t.low_clock_within}/{t.low_clock_rows} (target all); E(TP8)/E(TP4) within 15% "
          f"{t.tp_within}/{t.tp_rows}")


def sized(stack: Callable[[PerfModel], PerfModel], physics: dict[str, float] | None = None) -> dict[str, PerfModel]:
    out = {}
    for row_model, model in SIZED.items():
        perf = stack(perf_model_for(PROFILE, model))
        out[row_model] = perf if physics is None else with_physics(perf, physics)
    return out


def fit_data(rows: list[MeasuredRow]) -> FitData:
    return FitData(dynamollm_stack(perf_model_for(PROFILE, "llama2-70b")), [r for r in rows if r.table in FIT_ROWS],
                   splitwise_perf_model("llama2-70b", "h100-80gb"), throttllem_engine())


def leave_one_out(rows: list[MeasuredRow]) -> None:
    """Refit without each measurement (its weight to zero) and read the targets on the rest."""
    import energy.clock_fit as clock_fit

    print("\nleave one measurement out of the fit (targets on DynamoLLM's stack; A100 sweet spot)")
    for left_out in ("DynamoLLM Table I", "Splitwise power cap", "throttLL'eM A100"):
        saved = (clock_fit.CAP_WEIGHT, clock_fit.A100_WEIGHT)
        data = fit_data(rows)
        if left_out == "Splitwise power cap":
            clock_fit.CAP_WEIGHT = 0.0
        elif left_out == "throttLL'eM A100":
            clock_fit.A100_WEIGHT = 0.0
        else:
            data = dataclasses.replace(data, rows=[])
        try:
            fit = fit_clock_physics(data, from_last_fit=False)
        finally:
            clock_fit.CAP_WEIGHT, clock_fit.A100_WEIGHT = saved
        t = targets(check_rows(sized(dynamollm_stack, fit.h100), rows))
        spot = sweet_spot(with_physics(throttllem_engine(), fit.a100))
        cap = power_cap_report(perf=with_physics(splitwise_perf_model("llama2-70b", "h100-80gb"), fit.h100))
        print(f"without {left_out}: argmin {t.argmin_rows}/{t.rows}, "
              f"E0.8/E1.2 {t.low_clock_within}/{t.low_clock_rows}, "
              f"E8/E4 {t.tp_within}/{t.tp_rows}; A100 peak {spot.clock_mhz:.0f} MHz; cap MAPE prompt "
              f"{cap[0]:.1f}% token {cap[1]:.1f}%; {fit.h100}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise bench model-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--refit", action="store_true", help="fit the clock physics again and print them")
    p.add_argument("--leave-one-out", action="store_true", help="refit without each measurement in turn")
    args = p.parse_args(argv)
    rows = load_tables()
    gpu = GPUS["h100-80gb"]
    physics = ("idle_w", "token_compute_share", "roofline_sharpness", "prompt_compute_share", "prompt_core_power_share",
               "token_core_power_share", "voltage_knee", "voltage_floor", "tp_comm_ms_per_doubling",
               "tp_power_ratio_per_doubling")
    print(f"profile {PROFILE}; H100 physics: " + ", ".join(f"{f}={getattr(gpu, f)}" for f in physics))
    print_rows("DynamoLLM's stack (fitted on Table I; Table II low/high and Table III Llama3-70B held out)",
               check_rows(sized(dynamollm_stack), rows))
    print_rows("the default profile's own stack (2026 vLLM: less overhead per step)",
               check_rows(sized(lambda perf: perf), rows))
    as_input = [dataclasses.replace(r, counts_output=False) for r in rows]
    print("\nthe tables' loads read as input tokens alone (DynamoLLM's stack):")
    print_targets(targets(check_rows(sized(dynamollm_stack), as_input)))
    spot = sweet_spot(throttllem_engine())
    print(f"\nthrottLL'eM A100 (Llama2-13B TP2, batch 32): tokens/J peak at {spot.clock_mhz:.0f} MHz "
          f"(measured {THROTTLLEM_SWEET_SPOT_MHZ}; held out); at 1,050 MHz tokens/J x{spot.efficiency_gain:.3f} "
          f"(measured 1.374) and TBT x{spot.tbt_stretch:.3f} (measured 1.054), both fitted")
    prompt_mape, token_mape = power_cap_report()
    print(f"Splitwise's H100 capped at 350 W: prompt-time MAPE {prompt_mape:.1f}%, token-time MAPE {token_mape:.1f}%")
    tp = fit_tp_scaling(gpu)
    print(f"TP law on ML.ENERGY's TP1/TP2 pairs: all-reduce +{tp.comm_ms_per_doubling:.2f} ms per doubling, "
          f"above-floor power x{tp.power_ratio_per_doubling:.3f} per doubling, ITL MAPE {tp.itl_mape_pct:.1f}%")
    if args.refit:
        fit = fit_clock_physics(fit_data(rows))
        print(f"\nrefit (loss {fit.loss:.3f}):\n  h100: {fit.h100}\n  a100: {fit.a100}")
        print_targets(targets(check_rows(sized(dynamollm_stack, fit.h100), rows)))
        print(f"  A100 tokens/J peak at {sweet_spot(with_physics(throttllem_engine(), fit.a100)).clock_mhz:.0f} MHz")
    if args.leave_one_out:
        leave_one_out(rows)
    ratios = np.array([c.tp8_over_tp4 for c in counted(check_rows(sized(dynamollm_stack), rows)) if c.tp8_over_tp4])
    print(f"\nE(TP8)/E(TP4) over Tables I-II, median measured {np.median(ratios[:, 0]):.2f}, "
          f"model {np.median(ratios[:, 1]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
