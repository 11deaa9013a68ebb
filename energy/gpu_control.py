"""GPU control behind one protocol: NVML on real GPUs, a modelled GPU otherwise.

Reads (clocks, power, energy counter) need no privilege; locking clocks and setting
power limits need root or CAP_SYS_ADMIN, so the serving path reaches them only
through the per-node GPU-control actor (deployments/gpu_actor.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from energy.hardware import GpuSpec

logger = logging.getLogger(__name__)


class GpuControlError(RuntimeError):
    pass


class GpuControl(Protocol):
    backend: str

    def device_count(self) -> int: ...

    def supported_clocks_mhz(self, index: int) -> list[int]: ...

    def lock_clock(self, index: int, clock_mhz: int) -> None: ...

    def reset_clock(self, index: int) -> None: ...

    def clock_mhz(self, index: int) -> int: ...

    def power_limit_w(self, index: int) -> float: ...

    def set_power_limit_w(self, index: int, watts: float) -> None: ...

    def power_w(self, index: int) -> float: ...

    def energy_j(self, index: int) -> float: ...


class NvmlGpu:
    """nvidia-ml-py (`pynvml`) calls; every NVML error becomes a GpuControlError."""

    backend = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        """`nvml`: nvidia-ml-py's `pynvml` module (None: imported here) or an object with its
        API (a fake one on machines without a GPU)."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuControlError(f"NVML unavailable: {exc}") from exc
        self._handles: dict[int, object] = {}

    def _call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            raise GpuControlError(f"{fn.__name__} failed: {exc}") from exc

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._call(self.nvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def device_count(self) -> int:
        return int(self._call(self.nvml.nvmlDeviceGetCount))

    def supported_clocks_mhz(self, index: int) -> list[int]:
        h = self._handle(index)
        mem = max(self._call(self.nvml.nvmlDeviceGetSupportedMemoryClocks, h))
        return sorted(int(c) for c in self._call(self.nvml.nvmlDeviceGetSupportedGraphicsClocks, h, mem))

    def lock_clock(self, index: int, clock_mhz: int) -> None:
        self._call(self.nvml.nvmlDeviceSetGpuLockedClocks, self._handle(index), clock_mhz, clock_mhz)

    def reset_clock(self, index: int) -> None:
        self._call(self.nvml.nvmlDeviceResetGpuLockedClocks, self._handle(index))

    def clock_mhz(self, index: int) -> int:
        return int(self._call(self.nvml.nvmlDeviceGetClockInfo, self._handle(index), self.nvml.NVML_CLOCK_GRAPHICS))

    def power_limit_w(self, index: int) -> float:
        return self._call(self.nvml.nvmlDeviceGetPowerManagementLimit, self._handle(index)) / 1000.0

    def set_power_limit_w(self, index: int, watts: float) -> None:
        self._call(self.nvml.nvmlDeviceSetPowerManagementLimit, self._handle(index), int(watts * 1000))

    def power_w(self, index: int) -> float:
        return self._call(self.nvml.nvmlDeviceGetPowerUsage, self._handle(index)) / 1000.0

    def energy_j(self, index: int) -> float:
        return self._call(self.nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(index)) / 1000.0


class ModelledGpu:
    """Stand-in GPUs with a GpuSpec's clocks and limits; energy integrates idle power. A lock
    or reset may take `lock_latency_s`, as NVML's do (50-200 ms: bench/clock_rate.py)."""

    backend = "modelled"

    def __init__(self, spec: GpuSpec, count: int = 1, clock: Callable[[], float] = time.monotonic,
                 lock_latency_s: float = 0.0) -> None:
        self.spec = spec
        self.count = count
        self._clock = clock
        self.lock_latency_s = lock_latency_s
        self._locked: dict[int, int] = {}
        self._limit: dict[int, float] = {}
        self._start_s = clock()

    def _check(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise GpuControlError(f"no GPU {index}; this node has {self.count}")

    def device_count(self) -> int:
        return self.count

    def supported_clocks_mhz(self, index: int) -> list[int]:
        self._check(index)
        return self.spec.supported_clocks_mhz()

    def lock_clock(self, index: int, clock_mhz: int) -> None:
        self._check(index)
        if clock_mhz not in self.spec.supported_clocks_mhz():
            raise GpuControlError(f"{clock_mhz} MHz is not a supported clock")
        time.sleep(self.lock_latency_s)
        self._locked[index] = clock_mhz

    def reset_clock(self, index: int) -> None:
        self._check(index)
        time.sleep(self.lock_latency_s)
        self._locked.pop(index, None)

    def clock_mhz(self, index: int) -> int:
        self._check(index)
        return self._locked.get(index, self.spec.max_clock_mhz)

    def power_limit_w(self, index: int) -> float:
        self._check(index)
        return self._limit.get(index, self.spec.prompt_w)

    def set_power_limit_w(self, index: int, watts: float) -> None:
        self._check(index)
        self._limit[index] = watts

    def power_w(self, index: int) -> float:
        self._check(index)
        return self.spec.idle_w

    def energy_j(self, index: int) -> float:
        self._check(index)
        return (self._clock() - self._start_s) * self.spec.idle_w


def open_gpus(spec: GpuSpec, nvml: Any = None) -> GpuControl:
    """NVML if it initialises, else the modelled GPU (logged, and visible as `backend`)."""
    try:
        return NvmlGpu(nvml)
    except (GpuControlError, ImportError) as exc:
        logger.warning("GPU control falls back to the modelled %s: %s", spec.name, exc)
        return ModelledGpu(spec)
