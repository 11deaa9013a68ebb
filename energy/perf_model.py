"""Iteration latency and power of one replica, from batch shape, TP and GPU clock.

A step at max clock takes what the profile measured (PhaseFit). It splits into two parts:

- **overhead**: what is left of the decode step's fixed part once the GPUs have streamed the
  weights (CPU scheduling, kernel launches, waits in the tensor-parallel all-reduce). It does
  not stretch with the SM clock, and the GPUs draw their floor power through it.
- **work**: the rest. A share of it is compute-bound at max clock (GpuSpec's compute shares);
  at a lower clock it stretches as a smoothed roofline: flat while memory-bound, then as
  1/clock once the compute part overtakes the memory part.

Power: the floor (a loaded, idle GPU) plus, while working, an above-floor part whose core share
follows DVFS (f * V(f)^2, the voltage flat below a knee) and whose rest (HBM, uncore) does not.
At a lower clock work stretches while overhead does not, so the GPUs spend more of each step
working: what makes the lowest clocks lose at a fixed load (DynamoLLM Tables I-II).
Decode power at max clock is the GPU's constant token_w or, for a profile fitted on
ML.ENERGY's sweeps, a measured curve over load (energy.power_curve); both are read at the TP
the power was measured at and moved to other TPs by the GPU's measured per-doubling ratio.
The clock and TP parameters are fitted on measurements (energy.clock_fit). Shared by the
real-time modelled engine, the simulator and every planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from energy.hardware import GpuSpec, ModelSpec
from energy.power_curve import DecodePowerCurve

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class PhaseFit:
    """Latency at max clock, in ms, for one TP degree.

    prefill_ms = p0 + p1 * tokens + p2 * sum(prompt_len^2)     (attention is quadratic)
    decode_ms  = d0 + d1 * batch + d2 * context_tokens          (KV reads grow with context)
    """

    p0: float
    p1: float
    p2: float
    d0: float
    d1: float
    d2: float


@dataclass(frozen=True)
class IterationCost:
    time_s: float
    power_w: float  # all GPUs of the replica together

    @property
    def energy_j(self) -> float:
        return self.time_s * self.power_w


@dataclass(frozen=True)
class DecodeCoefficients:
    """A decode step at one TP and clock, in ms: fixed_ms + per_seq_ms * batch + per_ctx_ms *
    context tokens. Linear in the batch at any clock, so a fluid model solves it in closed form."""

    fixed_ms: float
    per_seq_ms: float
    per_ctx_ms: float

    def step_ms(self, batch: float, context_tokens: float) -> float:
        return self.fixed_ms + self.per_seq_ms * batch + self.per_ctx_ms * context_tokens


class PerfModel:
    """Latency and power for a (GPU, model) pair at any supported TP and clock.

    `power_tp`: the TP at which token_w / the decode curve was measured; other TPs move
    its above-floor part by GpuSpec.tp_power_ratio_per_doubling per doubling."""

    def __init__(
        self, gpu: GpuSpec, model: ModelSpec, fits: dict[int, PhaseFit], decode_power: DecodePowerCurve | None = None,
        power_tp: int | None = None,
    ) -> None:
        if not fits:
            raise ValueError("a performance model needs at least one TP fit")
        self.gpu = gpu
        self.model = model
        self.fits = dict(sorted(fits.items()))
        self.decode_power = decode_power
        self.power_tp = power_tp or max(self.fits)
        self._overhead_ms = {tp: min(max(f.d0 - self.weight_read_ms(tp), 0.0), f.d0) for tp, f in self.fits.items()}

    @property
    def tensor_parallel_degrees(self) -> list[int]:
        return list(self.fits)

    def _fit(self, tp: int) -> PhaseFit:
        try:
            return self.fits[tp]
        except KeyError:
            raise ValueError(f"no performance fit for TP{tp}; have {self.tensor_parallel_degrees}") from None

    # --- the step's parts -------------------------------------------------------------------

    def weight_read_ms(self, tp: int) -> float:
        """Streaming one GPU's share of the weights at the HBM bandwidth the GPU sustains."""
        bandwidth = self.gpu.hbm_tb_per_s
        if bandwidth is None:
            return 0.0
        return self.model.weight_bytes / tp / (bandwidth * 1e12 * self.gpu.hbm_efficiency) * 1000

    def overhead_ms(self, tp: int) -> float:
        """The clock-invariant part of every step at `tp` (GPUs at floor power through it)."""
        self._fit(tp)
        return self._overhead_ms[tp]

    def _ratio(self, clock_mhz: float) -> float:
        clock = min(max(clock_mhz, self.gpu.min_clock_mhz), self.gpu.max_clock_mhz)
        return clock / self.gpu.max_clock_mhz

    def work_stretch(self, phase: str, clock_mhz: float) -> float:
        """How much longer a step's work (not its overhead) takes at `clock_mhz` than at max
        clock: a roofline, smoothed by GpuSpec.roofline_sharpness (1: the two parts add)."""
        gpu = self.gpu
        compute = gpu.prompt_compute_share if phase == "prompt" else gpu.token_compute_share
        n = gpu.roofline_sharpness if phase == "token" else 1.0
        x = self._ratio(clock_mhz)
        memory = 1.0 - compute
        return ((memory**n + (compute / x) ** n) / (memory**n + compute**n)) ** (1.0 / n)

    def voltage(self, clock_mhz: float) -> float:
        """Core voltage relative to max clock's: flat at voltage_floor up to the knee, then
        linear up to 1 at max clock."""
        gpu = self.gpu
        x = self._ratio(clock_mhz)
        if x <= gpu.voltage_knee or gpu.voltage_knee >= 1.0:
            return gpu.voltage_floor
        return gpu.voltage_floor + (1.0 - gpu.voltage_floor) * (x - gpu.voltage_knee) / (1.0 - gpu.voltage_knee)

    def core_power_factor(self, clock_mhz: float) -> float:
        """Dynamic core power relative to max clock: f * V(f)^2."""
        volt = self.voltage(clock_mhz)
        return self._ratio(clock_mhz) * volt * volt

    def _clock_factor(self, core_share: float, clock_mhz: float) -> float:
        return core_share * self.core_power_factor(clock_mhz) + 1.0 - core_share

    def _tp_power_factor(self, tp: int) -> float:
        return self.gpu.tp_power_ratio_per_doubling ** math.log2(tp / self.power_tp)

    # --- time -------------------------------------------------------------------------------

    def decode_coefficients(self, tp: int, clock_mhz: float) -> DecodeCoefficients:
        f = self._fit(tp)
        overhead = self._overhead_ms[tp]
        s = self.work_stretch("token", clock_mhz)
        return DecodeCoefficients(overhead + (f.d0 - overhead) * s, f.d1 * s, f.d2 * s)

    def _prefill_overhead_ms(self, tp: int) -> float:
        return min(self._overhead_ms[tp], self._fit(tp).p0)

    def prefill_overhead_s(self, tp: int) -> float:
        """The clock-invariant part of each prefill step at `tp`."""
        return self._prefill_overhead_ms(tp) / 1000.0

    # Scalars per step; sim.metrics passes arrays (one entry a request) to the same formulas.
    @overload
    def prefill_time_s(self, tokens: float, sum_sq_tokens: float, tp: int, clock_mhz: float) -> float: ...
    @overload
    def prefill_time_s(self, tokens: np.ndarray, sum_sq_tokens: np.ndarray, tp: int,
                       clock_mhz: float) -> np.ndarray: ...
    def prefill_time_s(self, tokens: Any, sum_sq_tokens: Any, tp: int, clock_mhz: float) -> Any:
        f = self._fit(tp)
        overhead = self._prefill_overhead_ms(tp)
        work_ms = f.p0 - overhead + f.p1 * tokens + f.p2 * sum_sq_tokens
        return (overhead + work_ms * self.work_stretch("prompt", clock_mhz)) / 1000.0

    @overload
    def decode_time_s(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float: ...
    @overload
    def decode_time_s(self, batch: float, context_tokens: np.ndarray, tp: int, clock_mhz: float) -> np.ndarray: ...
    def decode_time_s(self, batch: float, context_tokens: Any, tp: int, clock_mhz: float) -> Any:
        return self.decode_coefficients(tp, clock_mhz).step_ms(batch, context_tokens) / 1000.0

    def decode_marginal_s(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float:
        """The per-sequence and per-context part of a decode step: what decoding `batch`
        sequences adds to a step that already reads the weights for a prefill chunk."""
        c = self.decode_coefficients(tp, clock_mhz)
        return (c.per_seq_ms * batch + c.per_ctx_ms * context_tokens) / 1000.0

    # --- power ------------------------------------------------------------------------------

    def _decode_top_w(self, batch: float, context_tokens: float, tp: int) -> float:
        """Mean power of one GPU over a decode step at max clock: as measured at power_tp (a
        curve reads the step's per-sequence share there), moved to `tp` by the GPU's TP law."""
        if self.decode_power is None:
            measured = self.gpu.token_w
        else:
            f = self.fits.get(self.power_tp) or self._fit(tp)
            per_seq_ms = f.d1 * batch + f.d2 * context_tokens
            measured = self.decode_power.power_w(per_seq_ms / (f.d0 + per_seq_ms) if per_seq_ms > 0 else 0.0)
        return self.gpu.idle_w + (measured - self.gpu.idle_w) * self._tp_power_factor(tp)

    def _work_w(self, phase: str, top_w: float, clock_mhz: float) -> float:
        """Power of one GPU while working in `phase` at `clock_mhz`, given its working power at
        max clock: the core share follows DVFS, the rest (HBM, uncore) does not."""
        gpu = self.gpu
        share = gpu.prompt_core_power_share if phase == "prompt" else gpu.token_core_power_share
        return gpu.idle_w + max(top_w - gpu.idle_w, 0.0) * self._clock_factor(share, clock_mhz)

    def phase_power_w(self, phase: str, clock_mhz: float, tp: int | None = None) -> float:
        """Power of one GPU while working in `phase` ('prompt' or 'token') at `clock_mhz`. A
        prefill keeps every GPU of the replica compute-bound: prompt_w at any TP. With a measured
        decode curve, a caller that knows no batch gets its saturated power."""
        if phase == "prompt":
            return self._work_w("prompt", self.gpu.prompt_w, clock_mhz)
        tp = self.power_tp if tp is None else tp
        top = self.gpu.token_w if self.decode_power is None else self.decode_power.saturated_w
        return self._work_w("token", self.gpu.idle_w + (top - self.gpu.idle_w) * self._tp_power_factor(tp), clock_mhz)

    def _decode_working_w(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float:
        """Power of one GPU while it works on a decode step (not through its overhead)."""
        f = self._fit(tp)
        overhead = self._overhead_ms[tp]
        top_step = f.d0 + f.d1 * batch + f.d2 * context_tokens
        if top_step <= overhead:
            return self.gpu.idle_w
        # The mean at max clock includes the overhead at floor: the working power is above it.
        top_w = self._decode_top_w(batch, context_tokens, tp)
        working_top = self.gpu.idle_w + (top_w - self.gpu.idle_w) * top_step / (top_step - overhead)
        return self._work_w("token", working_top, clock_mhz)

    def decode_power_w(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float:
        """Mean power of one GPU over a decode step of `batch` sequences: floor through the
        overhead, working power through the rest. At max clock it is the measured power."""
        step = self.decode_coefficients(tp, clock_mhz).step_ms(batch, context_tokens)
        if step <= 0:
            return self.gpu.idle_w
        working = self._decode_working_w(batch, context_tokens, tp, clock_mhz)
        return self.gpu.idle_w + (working - self.gpu.idle_w) * (step - self._overhead_ms[tp]) / step

    def iteration(
        self,
        prefill_tokens: int,
        prefill_sum_sq: float,
        decode_batch: int,
        decode_context_tokens: int,
        tp: int,
        clock_mhz: float,
    ) -> IterationCost:
        """One engine step that prefills some tokens and decodes one token per sequence.

        A mixed step pays the prefill and only the marginal (per-sequence and
        per-context) part of decode: the fixed weight read is shared.
        """
        if prefill_tokens <= 0 and decode_batch <= 0:
            return IterationCost(0.0, self.idle_power_w(tp))
        if prefill_tokens <= 0:
            t = self.decode_time_s(decode_batch, decode_context_tokens, tp, clock_mhz)
            return IterationCost(t, self.decode_power_w(decode_batch, decode_context_tokens, tp, clock_mhz) * tp)
        t_prefill = self.prefill_time_s(prefill_tokens, prefill_sum_sq, tp, clock_mhz)
        t_decode = (self.decode_marginal_s(decode_batch, decode_context_tokens, tp, clock_mhz)
                    if decode_batch > 0 else 0.0)
        overhead_s = self._prefill_overhead_ms(tp) / 1000.0
        working_s = t_prefill - overhead_s
        energy_per_gpu = (overhead_s * self.gpu.idle_w
                          + working_s * self.phase_power_w("prompt", clock_mhz, tp)
                          + t_decode * self._decode_working_w(decode_batch, decode_context_tokens, tp, clock_mhz))
        total = t_prefill + t_decode
        return IterationCost(total, energy_per_gpu / total * tp)

    def prefill_power_w(self, tokens: float, sum_sq_tokens: float, tp: int, clock_mhz: float) -> float:
        """Mean power of one GPU over a prefill step: floor through its overhead."""
        t = self.prefill_time_s(tokens, sum_sq_tokens, tp, clock_mhz)
        overhead_s = self._prefill_overhead_ms(tp) / 1000.0
        if t <= 0:
            return self.gpu.idle_w
        return (overhead_s * self.gpu.idle_w + (t - overhead_s) * self.phase_power_w("prompt", clock_mhz, tp)) / t

    def least_energy_clock_mhz(self, batch: float, context_tokens: float, tp: int,
                               clocks_mhz: Sequence[float]) -> float:
        """Of `clocks_mhz`, the one at which a decode step of `batch` sequences costs the least
        energy above the floor (what the floor costs is paid whatever the clock). Below it the
        work stretches faster than its power falls: a lower clock saves no energy, it spends it."""
        floor = self.gpu.idle_w

        def above_floor_j(clock: float) -> float:
            work_s = self.decode_time_s(batch, context_tokens, tp, clock) - self._overhead_ms[tp] / 1000.0
            return work_s * (self._decode_working_w(batch, context_tokens, tp, clock) - floor)

        return min(clocks_mhz, key=above_floor_j)

    def idle_power_w(self, tp: int) -> float:
        return self.gpu.idle_w * tp

    def kv_capacity_tokens(self, tp: int) -> int:
        return self.model.kv_capacity_tokens(self.gpu, tp)

    def clock_under_power_cap(self, phase: str, cap_w_per_gpu: float) -> float:
        """Highest supported clock whose `phase` power fits under a per-GPU cap.

        A power-capped GPU behaves like one locked at this clock (Splitwise HHcap)."""
        best = float(self.gpu.min_clock_mhz)
        for clock in self.gpu.supported_clocks_mhz():
            if self.phase_power_w(phase, clock) <= cap_w_per_gpu:
                best = float(clock)
        return best
