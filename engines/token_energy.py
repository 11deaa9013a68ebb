"""Energy per request on a real GPU: NVML energy-counter deltas shared out by tokens.

NVML counts joules per GPU, not per request. Over a request's life, the energy its
GPUs used is split by its share of the tokens the engine processed meanwhile (prompt
and generated), the same token-proportional rule the sim engine applies per step.
Without NVML (CPU backends, no driver) energy is reported as 0 and logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from energy.gpu_control import GpuControlError, NvmlGpu

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnergyMark:
    energy_j: float
    engine_tokens: int


class TokenEnergyMeter:
    def __init__(self, gpu_indices: list[int], engine_tokens: Callable[[], int], nvml: NvmlGpu | None = None) -> None:
        self.gpu_indices = gpu_indices
        self._engine_tokens = engine_tokens
        self._nvml = nvml

    @classmethod
    def open(cls, gpu_indices: list[int], engine_tokens: Callable[[], int]) -> TokenEnergyMeter:
        if not gpu_indices:
            logger.warning("no GPUs assigned: request energy is reported as 0 J")
            return cls([], engine_tokens)
        try:
            return cls(gpu_indices, engine_tokens, NvmlGpu())
        except (GpuControlError, ImportError) as exc:
            logger.warning("NVML unavailable (%s): request energy is reported as 0 J", exc)
            return cls([], engine_tokens)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def total_j(self) -> float:
        if self._nvml is None:
            return 0.0
        return sum(self._nvml.energy_j(i) for i in self.gpu_indices)

    def power_w(self) -> float:
        if self._nvml is None:
            return 0.0
        return sum(self._nvml.power_w(i) for i in self.gpu_indices)

    def mark(self) -> EnergyMark:
        return EnergyMark(self.total_j(), self._engine_tokens())

    def attribute_j(self, start: EnergyMark, request_tokens: int) -> float:
        """The request's share of the energy used since `start`."""
        if self._nvml is None:
            return 0.0
        end = self.mark()
        engine_tokens = max(end.engine_tokens - start.engine_tokens, request_tokens, 1)
        return (end.energy_j - start.energy_j) * request_tokens / engine_tokens
