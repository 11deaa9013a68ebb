"""A fake NVML for machines without a GPU: nvidia-ml-py's function names and error type (checked
against `pynvml` in tests/unit/energy/test_gpu_control.py) over fake devices.

The machine's edge is the one place the tests mock: everything above NVML (NvmlGpu, the clock
governor, the GPU-control actor, replicas, meters) runs as it would on a GPU. What a test may
set: how long a clock lock or reset takes (NVML's 50-200 ms), which calls fail, the power the
devices draw over time (the energy counter integrates it, as the driver's does), and a file
holding the devices' state, so that several processes (a restarted Ray actor, the test reading
it) see the same GPUs. Picklable, for a Ray actor's constructor.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRAPHICS_CLOCKS_MHZ = (1980, 1600, 1200, 990, 800)
DEFAULT_CLOCK_MHZ = 1980  # what an unlocked device runs at


class FakeNvmlError(Exception):
    pass


@dataclass(frozen=True)
class PowerTrace:
    """Watts per device from each start time on (the first segment from the fake's start)."""

    segments: tuple[tuple[float, float], ...] = ((0.0, 100.0),)

    def watts(self, t_s: float) -> float:
        starts = [s for s, _ in self.segments]
        return self.segments[max(bisect.bisect_right(starts, t_s) - 1, 0)][1]

    def energy_j(self, t0_s: float, t1_s: float) -> float:
        """The integral of the trace from `t0_s` to `t1_s`."""
        total = 0.0
        for i, (start, watts) in enumerate(self.segments):
            end = self.segments[i + 1][0] if i + 1 < len(self.segments) else float("inf")
            if i == 0:
                start = float("-inf")
            total += watts * max(0.0, min(end, t1_s) - max(start, t0_s))
        return total


class FakeNvml:
    NVML_CLOCK_GRAPHICS = 0
    NVMLError = FakeNvmlError

    def __init__(self, count: int = 2, state_path: Path | str | None = None, lock_latency_s: float = 0.0,
                 power: PowerTrace = PowerTrace(), clock: Callable[[], float] = time.monotonic,
                 fail: frozenset[str] = frozenset(), init_error: bool = False) -> None:
        self.count = count
        self.state_path = None if state_path is None else str(state_path)
        self.lock_latency_s = lock_latency_s
        self.power = power
        self.clock = clock
        self.fail = set(fail)
        self.init_error = init_error
        self.start_s = clock()  # the driver's load: the energy counter counts from here
        self._memory = self._fresh()
        self.most_locks_at_once = 0  # clock locks and resets in flight together (this process's)
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        if self.state_path is not None and not Path(self.state_path).exists():
            Path(self.state_path).write_text(json.dumps(self._memory))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a Ray actor's constructor: its lock stays here."""
        return {k: v for k, v in self.__dict__.items() if k != "_in_flight_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._in_flight_lock = threading.Lock()

    @staticmethod
    def _fresh() -> dict[str, Any]:
        return {"locked": {}, "limit_mw": {}, "calls": []}

    # ---- state: in memory, or in a file every process shares ----------------------
    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        if self.state_path is None:
            yield self._memory
            return
        with open(self.state_path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            state = json.load(f)
            yield state
            f.seek(0)
            f.truncate()
            json.dump(state, f)

    def read_state(self) -> dict[str, Any]:
        with self._state() as state:
            return json.loads(json.dumps(state))

    def locked(self) -> dict[int, int]:
        """Each locked device's clock (absent: at the driver's default)."""
        return {int(i): clocks[0] for i, clocks in self.read_state()["locked"].items()}

    def lock_outside(self, index: int, clock_mhz: int) -> None:
        """A clock some other process locked (an earlier run, a dead actor): not a call of ours."""
        with self._state() as state:
            state["locked"][str(self._device(index))] = [clock_mhz, clock_mhz]

    def calls(self, name: str) -> list[list[Any]]:
        """Each call of NVML function `name` made so far: [time, args...]."""
        return [c[1:] for c in self.read_state()["calls"] if c[0] == name]

    def _record(self, state: dict[str, Any], name: str, *args: Any) -> None:
        state["calls"].append([name, self.clock(), *args])

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise FakeNvmlError("Insufficient Permissions")

    def _device(self, handle: int) -> int:
        if not 0 <= handle < self.count:
            raise FakeNvmlError("Invalid Argument")
        return handle

    # ---- NVML's functions, as nvidia-ml-py names them ----------------------------
    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNvmlError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex")
        return self._device(index)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: int) -> list[int]:
        self._check("nvmlDeviceGetSupportedMemoryClocks")
        return [2619, 1593]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: int, memory_mhz: int) -> list[int]:
        self._check("nvmlDeviceGetSupportedGraphicsClocks")
        return list(GRAPHICS_CLOCKS_MHZ)

    @contextmanager
    def _taking_latency(self) -> Iterator[None]:
        with self._in_flight_lock:
            self._in_flight += 1
            self.most_locks_at_once = max(self.most_locks_at_once, self._in_flight)
        try:
            time.sleep(self.lock_latency_s)
            yield
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def nvmlDeviceSetGpuLockedClocks(self, handle: int, low_mhz: int, high_mhz: int) -> None:
        self._check("nvmlDeviceSetGpuLockedClocks")
        with self._taking_latency(), self._state() as state:
            state["locked"][str(self._device(handle))] = [low_mhz, high_mhz]
            self._record(state, "nvmlDeviceSetGpuLockedClocks", handle, low_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: int) -> None:
        self._check("nvmlDeviceResetGpuLockedClocks")
        with self._taking_latency(), self._state() as state:
            state["locked"].pop(str(self._device(handle)), None)
            self._record(state, "nvmlDeviceResetGpuLockedClocks", handle)

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        self._check("nvmlDeviceGetClockInfo")
        with self._state() as state:
            return state["locked"].get(str(self._device(handle)), [DEFAULT_CLOCK_MHZ])[0]

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        self._check("nvmlDeviceGetPowerManagementLimit")
        with self._state() as state:
            return state["limit_mw"].get(str(self._device(handle)), 700_000)

    def nvmlDeviceSetPowerManagementLimit(self, handle: int, milliwatts: int) -> None:
        self._check("nvmlDeviceSetPowerManagementLimit")
        with self._state() as state:
            state["limit_mw"][str(self._device(handle))] = milliwatts

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        self._device(handle)
        return round(self.power.watts(self.clock() - self.start_s) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        """Millijoules since the driver loaded: the power trace integrated up to now."""
        self._check("nvmlDeviceGetTotalEnergyConsumption")
        self._device(handle)
        return round(self.power.energy_j(0.0, self.clock() - self.start_s) * 1000)
