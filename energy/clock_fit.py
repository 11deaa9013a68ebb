"""Fit the GPUs' clock physics (energy.perf_model) on measurements, and hold some out.

One fit reads three measurements at once:
- DynamoLLM's Table I (H100, Llama2-70B, nine length classes at a fixed load), read on the stack
  DynamoLLM measured (energy.model_check.dynamollm_stack) with the default profile's latencies,
  as the GPU energy of the 8-GPU server (energy.model_check.server_cells).
  Table II's low and high loads and Table III's Llama3-70B row are held out.
- Splitwise's power-capped H100 (350 W per GPU): its prompt and token times, predicted from the
  uncapped fit plus the power model (energy.calibration.power_cap_report).
- throttLL'eM's A100 characterisation (Llama2-13B, TP2, batch 32): TBT +5.41% and tokens/J
  +37.4% at 1,050 MHz against 1,410. Where the efficiency peaks (1,050 MHz) is held out.

The compute shares, the roofline's sharpness, the prefill core share and the voltage floor are
shared by both GPUs; each GPU has its own decode core share and voltage knee. The floor power
(DynamoLLM's measured 110 W) and the TP law (energy.tp_scaling, ML.ENERGY's pairs) are measured,
not fitted here. The loss has the targets' own shape: the measured argmin's cost in the model
above 3%, the error of E(0.8 GHz)/E(1.2 GHz) beyond 0.04, the error of E(TP8)/E(TP4) beyond 10%,
the row's shape error, the measured cells the model calls infeasible; the capped rows' MAPE;
the A100 numbers' log errors. Bounds keep each parameter physical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from energy.calibration import power_cap_report
from energy.dynamollm_tables import MeasuredRow
from energy.model_check import (
    ARGMIN_TOLERANCE,
    LOW_CLOCK_TOLERANCE,
    THROTTLLEM_EFFICIENCY_GAIN,
    THROTTLLEM_TBT_STRETCH,
    RowCheck,
    server_cells,
    sweet_spot,
)
from energy.perf_model import PerfModel

# GpuSpec field -> physical bounds.
BOUNDS: dict[str, tuple[float, float]] = {
    "token_compute_share": (0.05, 0.8),
    "roofline_sharpness": (1.0, 16.0),
    "prompt_compute_share": (0.5, 1.0),
    "prompt_core_power_share": (0.1, 0.95),
    "voltage_floor": (0.55, 0.85),
    "token_core_power_share": (0.1, 0.9),
    "voltage_knee": (0.35, 0.85),
}
OWN = ("token_core_power_share", "voltage_knee")  # fitted per GPU; the rest shared
FIT_ROWS = ("I",)  # tables fitted on; the rest are held out
CAP_WEIGHT = 4.0
A100_WEIGHT = 10.0
STARTS = 64
SEED = 0


def with_physics(perf: PerfModel, physics: dict[str, float]) -> PerfModel:
    """`perf` on a GPU with these clock fields (the same fits and power curve)."""
    gpu = perf.gpu.model_copy(update=physics)
    return PerfModel(gpu, perf.model, perf.fits, perf.decode_power, perf.power_tp)


def row_loss(check: RowCheck) -> float:
    loss = 0.05 * float(np.sum(~np.isnan(check.row.energy_wh) & np.isnan(check.model)))
    if check.both.sum() < 2:
        return loss + 1.0
    cost = check.argmin_cost
    loss += 4 * max(0.0, float(np.log(cost)) - float(np.log(ARGMIN_TOLERANCE))) if np.isfinite(cost) else 0.5
    low = check.low_clock_ratio
    if low is not None:
        loss += 4 * max(0.0, abs(low[1] - low[0]) - (LOW_CLOCK_TOLERANCE - 0.02)) if np.isfinite(low[1]) else 0.3
    tp = check.tp8_over_tp4
    if tp is not None and np.isfinite(tp[1]):
        loss += 2 * max(0.0, abs(float(np.log(tp[1] / tp[0]))) - 0.1)
    return loss + check.shape_error**2


def table_loss(perf: PerfModel, rows: list[MeasuredRow]) -> float:
    return sum(row_loss(RowCheck(r, server_cells(perf, r))) for r in rows)


def power_cap_loss(capped: PerfModel) -> float:
    prompt_mape, token_mape = power_cap_report(perf=capped)
    return (prompt_mape / 100) ** 2 + (token_mape / 100) ** 2


def a100_loss(engine: PerfModel) -> float:
    spot = sweet_spot(engine)
    return float(np.log(spot.tbt_stretch / THROTTLLEM_TBT_STRETCH) ** 2
                 + np.log(spot.efficiency_gain / THROTTLLEM_EFFICIENCY_GAIN) ** 2)


@dataclass(frozen=True)
class FitData:
    """What the fit reads: H100 as DynamoLLM measured it, the same H100 under Splitwise's power
    cap, and throttLL'eM's A100 engine."""

    dynamollm: PerfModel
    rows: list[MeasuredRow]
    capped: PerfModel
    a100: PerfModel


@dataclass(frozen=True)
class ClockFit:
    h100: dict[str, float]
    a100: dict[str, float]
    loss: float


def _names() -> list[str]:
    shared = [n for n in BOUNDS if n not in OWN]
    return shared + [f"h100.{n}" for n in OWN] + [f"a100.{n}" for n in OWN]


def _physics(values: np.ndarray) -> tuple[dict[str, float], dict[str, float]]:
    named = dict(zip(_names(), values.tolist(), strict=True))
    shared = {n: v for n, v in named.items() if "." not in n}
    return (shared | {n: named[f"h100.{n}"] for n in OWN}, shared | {n: named[f"a100.{n}"] for n in OWN})


def _last_fit(data: FitData) -> np.ndarray:
    """The physics the GPUs carry now (energy.hardware): where the last fit stopped."""
    h100, a100 = data.dynamollm.gpu, data.a100.gpu
    return np.array([getattr(a100 if n.startswith("a100.") else h100, n.split(".")[-1]) for n in _names()])


def fit_clock_physics(data: FitData, from_last_fit: bool = True) -> ClockFit:
    """Seeded random starts inside the bounds and the last fit, the best three polished by
    Nelder-Mead: a refit on new data or a new loss moves on from where the last one stopped.
    A fit that leaves a measurement out starts from random points only (`from_last_fit`
    False): the last fit saw that measurement."""
    names = _names()
    low = np.array([BOUNDS[n.split(".")[-1]][0] for n in names])
    high = np.array([BOUNDS[n.split(".")[-1]][1] for n in names])

    def loss_at(v: np.ndarray) -> float:
        h100, a100 = _physics(np.clip(v, low, high))
        return (table_loss(with_physics(data.dynamollm, h100), data.rows)
                + CAP_WEIGHT * power_cap_loss(with_physics(data.capped, h100))
                + A100_WEIGHT * a100_loss(with_physics(data.a100, a100)))

    rng = np.random.default_rng(SEED)
    starts = list(low + rng.random((STARTS, len(names))) * (high - low))
    if from_last_fit:
        starts.append(np.clip(_last_fit(data), low, high))
    best = min((minimize(loss_at, s, method="Nelder-Mead", options={"maxiter": 3000, "xatol": 1e-4, "fatol": 1e-6})
                for s in sorted(starts, key=loss_at)[:3]), key=lambda r: r.fun)
    h100, a100 = _physics(np.clip(best.x, low, high))
    return ClockFit({n: round(v, 4) for n, v in h100.items()}, {n: round(v, 4) for n, v in a100.items()},
                    float(best.fun))
