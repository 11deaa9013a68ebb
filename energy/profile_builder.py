"""Build an EnergyProfile from the performance/power model (the default profile).

For each class shape, TP and clock: find the highest load one instance carries within
the class's TTFT and TBT targets, sample loads up to it, and add points where power
jumps between neighbours. The steady state at each load comes from the fluid
CapacityModel on the same perf model the replicas run.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from core.classes import LengthClassConfig
from energy.capacity import CapacityModel, Load
from energy.perf_model import PerfModel
from energy.profile import CONV_CLASS_SHAPES, EnergyProfile, ProfilePoint, profile_clocks_mhz

LOAD_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
# A step in power above this share between neighbouring loads earns a midpoint.
POWER_JUMP = 0.15
MAX_REFINE = 3

Measure = Callable[[float], tuple[float, float, float] | None]


def steady_state_measure(cap: CapacityModel, load_shape: tuple[int, int], tp: int, clock_mhz: float,
                         tbt_slo_s: float) -> Measure:
    """(power W, TTFT s, TBT s) of one instance at a rate, or None if it cannot carry it.

    TTFT: one prompt's prefill, stretched by an M/D/1 wait on the prefill share of the
    instance, plus the decode step in flight when the prompt arrives."""
    prompt, output = load_shape

    def measure(rate: float) -> tuple[float, float, float] | None:
        op = cap.operating(tp, clock_mhz, 1, Load(rate, prompt, output), tbt_slo_s)
        if not op.feasible:
            return None
        rho = op.prefill_busy
        prefill = cap.prefill_s(tp, clock_mhz, prompt)
        ttft = prefill * (1 + rho / (2 * (1 - rho))) + op.tbt_s
        return op.power_w, ttft, op.tbt_s

    return measure


def max_feasible_rate(measure: Measure, ttft_slo_s: float, hi: float = 1000.0, iters: int = 40) -> float:
    """Bisect the highest rate whose steady state exists and meets the TTFT target."""
    def ok(rate: float) -> bool:
        value = measure(rate)
        return value is not None and value[1] <= ttft_slo_s

    lo = 0.0
    if not ok(1e-6):
        return 0.0
    while ok(hi):
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def curve(measure: Measure, top_rate: float) -> list[tuple[float, tuple[float, float, float]]]:
    """Sampled (rate, value) pairs up to `top_rate`, refined where power jumps."""
    measured = [(f * top_rate, measure(f * top_rate)) for f in LOAD_FRACTIONS]
    samples = [(r, v) for r, v in measured if v is not None]
    for _ in range(MAX_REFINE):
        extra: list[tuple[float, tuple[float, float, float]]] = []
        for (r0, v0), (r1, v1) in pairwise(samples):
            if abs(v1[0] - v0[0]) > POWER_JUMP * v0[0]:
                mid = (r0 + r1) / 2
                value = measure(mid)
                if value is not None:
                    extra.append((mid, value))
        if not extra:
            break
        samples = sorted(samples + extra)
    return samples


def build_profile(
    perf: PerfModel,
    lengths: LengthClassConfig = LengthClassConfig(),
    shapes: dict[str, tuple[int, int]] = CONV_CLASS_SHAPES,
    tps: tuple[int, ...] | None = None,
    clocks_mhz: tuple[int, ...] | None = None,
    kv_budget: float = 1.0,
) -> EnergyProfile:
    """Every class x TP x clock's curve up to its SLO-feasible load, from the perf model; a
    load filling more than `kv_budget` of an instance's KV counts as infeasible.
    `tps`: the TPs to profile (None: every TP the perf model has, TP1 for an 8B model);
    `clocks_mhz`: the clocks (None: DynamoLLM's that the GPU runs, `profile_clocks_mhz`)."""
    cap = CapacityModel(perf, kv_budget=kv_budget)
    points = []
    for cls, shape in shapes.items():
        slo = lengths.slo(cls)
        for tp in tps or perf.tensor_parallel_degrees:
            if tp not in perf.fits:
                continue
            for clock in clocks_mhz or profile_clocks_mhz(perf.gpu):
                measure = steady_state_measure(cap, shape, tp, clock, slo.tbt_s)
                top = max_feasible_rate(measure, slo.ttft_s)
                if top <= 0:
                    continue
                points += [ProfilePoint(cls, tp, clock, r, *v) for r, v in curve(measure, top)]
    return EnergyProfile(perf.model.name, perf.gpu.name, points, perf.model.weight_bytes)
