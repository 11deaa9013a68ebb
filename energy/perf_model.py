"""Iteration latency and power of one replica, from batch shape, TP and GPU clock.

Latency: a fitted base at max clock, split into a compute-bound share that stretches
as 1/clock and a memory-bound share that does not (prefill is mostly the former,
decode mostly the latter). Power: idle plus an above-idle part whose core share
follows DVFS (linear below the voltage knee, cubic above it) and whose memory share
is flat. Decode power at max clock is the GPU's constant token_w, or, for a profile
fitted on ML.ENERGY's sweeps, a measured curve over load (energy.power_curve). Both are
shared by the real-time sim engine and the simulator.
"""

from __future__ import annotations

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


class PerfModel:
    """Latency and power for a (GPU, model) pair at any supported TP and clock."""

    def __init__(
        self, gpu: GpuSpec, model: ModelSpec, fits: dict[int, PhaseFit], decode_power: DecodePowerCurve | None = None
    ) -> None:
        if not fits:
            raise ValueError("a performance model needs at least one TP fit")
        self.gpu = gpu
        self.model = model
        self.fits = dict(sorted(fits.items()))
        self.decode_power = decode_power

    @property
    def tensor_parallel_degrees(self) -> list[int]:
        return list(self.fits)

    def _fit(self, tp: int) -> PhaseFit:
        try:
            return self.fits[tp]
        except KeyError:
            raise ValueError(f"no performance fit for TP{tp}; have {self.tensor_parallel_degrees}") from None

    def _clock_ratio(self, clock_mhz: float) -> float:
        clock = min(max(clock_mhz, self.gpu.min_clock_mhz), self.gpu.max_clock_mhz)
        return clock / self.gpu.max_clock_mhz

    def stretch(self, compute_share: float, clock_mhz: float) -> float:
        """Latency multiplier at `clock_mhz` relative to max clock."""
        return compute_share / self._clock_ratio(clock_mhz) + (1.0 - compute_share)

    def core_power_factor(self, clock_mhz: float) -> float:
        """Dynamic core power relative to max clock: f * V(f)^2 with a voltage floor."""
        x = self._clock_ratio(clock_mhz)
        volt = max(x, self.gpu.voltage_knee)
        return x * volt * volt

    def _at_clock_w(self, peak_w: float, core_share: float, clock_mhz: float) -> float:
        """Power of one GPU that draws `peak_w` at max clock, moved to `clock_mhz` by DVFS."""
        active = peak_w - self.gpu.idle_w
        return self.gpu.idle_w + active * (core_share * self.core_power_factor(clock_mhz) + 1 - core_share)

    def phase_power_w(self, phase: str, clock_mhz: float) -> float:
        """Power of one GPU busy in `phase` ('prompt' or 'token') at `clock_mhz`. With a
        measured decode curve, a caller that knows no batch gets its saturated power."""
        if phase == "prompt":
            return self._at_clock_w(self.gpu.prompt_w, self.gpu.prompt_core_power_share, clock_mhz)
        peak_w = self.gpu.token_w if self.decode_power is None else self.decode_power.saturated_w
        return self._at_clock_w(peak_w, self.gpu.token_core_power_share, clock_mhz)

    def decode_power_w(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float:
        """Power of one GPU in a decode step of `batch` sequences: the measured curve over
        load where the profile has one, else the token-phase constant."""
        if self.decode_power is None:
            return self.phase_power_w("token", clock_mhz)
        f = self._fit(tp)
        per_seq_ms = f.d1 * batch + f.d2 * context_tokens
        share = per_seq_ms / (f.d0 + per_seq_ms) if per_seq_ms > 0 else 0.0
        return self._at_clock_w(self.decode_power.power_w(share), self.gpu.token_core_power_share, clock_mhz)

    # Scalars per step; sim.metrics passes arrays (one entry a request) to the same formulas.
    @overload
    def prefill_time_s(self, tokens: int, sum_sq_tokens: float, tp: int, clock_mhz: float) -> float: ...
    @overload
    def prefill_time_s(self, tokens: np.ndarray, sum_sq_tokens: np.ndarray, tp: int,
                       clock_mhz: float) -> np.ndarray: ...
    def prefill_time_s(self, tokens: Any, sum_sq_tokens: Any, tp: int, clock_mhz: float) -> Any:
        f = self._fit(tp)
        base_ms = f.p0 + f.p1 * tokens + f.p2 * sum_sq_tokens
        return base_ms * self.stretch(self.gpu.prompt_compute_share, clock_mhz) / 1000.0

    @overload
    def decode_time_s(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float: ...
    @overload
    def decode_time_s(self, batch: float, context_tokens: np.ndarray, tp: int, clock_mhz: float) -> np.ndarray: ...
    def decode_time_s(self, batch: float, context_tokens: Any, tp: int, clock_mhz: float) -> Any:
        f = self._fit(tp)
        base_ms = f.d0 + f.d1 * batch + f.d2 * context_tokens
        return base_ms * self.stretch(self.gpu.token_compute_share, clock_mhz) / 1000.0

    def decode_marginal_s(self, batch: float, context_tokens: float, tp: int, clock_mhz: float) -> float:
        """The per-sequence and per-context part of a decode step: what decoding `batch`
        sequences adds to a step that already reads the weights for a prefill chunk."""
        f = self._fit(tp)
        return (f.d1 * batch + f.d2 * context_tokens) * self.stretch(self.gpu.token_compute_share, clock_mhz) / 1000.0

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
        t_prefill = self.prefill_time_s(prefill_tokens, prefill_sum_sq, tp, clock_mhz) if prefill_tokens > 0 else 0.0
        if decode_batch <= 0:
            t_decode = 0.0
        elif prefill_tokens <= 0:
            t_decode = self.decode_time_s(decode_batch, decode_context_tokens, tp, clock_mhz)
        else:
            t_decode = self.decode_marginal_s(decode_batch, decode_context_tokens, tp, clock_mhz)
        total = t_prefill + t_decode
        power_per_gpu = (
            t_prefill * self.phase_power_w("prompt", clock_mhz)
            + t_decode * self.decode_power_w(decode_batch, decode_context_tokens, tp, clock_mhz)
        ) / total
        return IterationCost(total, power_per_gpu * tp)

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
