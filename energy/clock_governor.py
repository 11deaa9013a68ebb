"""Safe clock changes: clamp to supported values, rate-limit, record, restore.

Every change calls NVML and lands 50-200 ms later, so a governor refuses changes
closer together than `min_interval_s` per GPU and skips no-op changes. On any NVML
error (a lock, or a read through `energy_j`) it resets the GPU's clocks to the driver
default (fail static to max performance) and keeps them there for `hold_default_s`
instead of re-locking a GPU that just failed at every request.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from energy.gpu_control import GpuControl, GpuControlError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClockChange:
    at_s: float
    index: int
    requested_mhz: int
    applied_mhz: int | None  # None: refused (rate limit) or failed
    note: str


class ClockGovernor:
    def __init__(self, gpus: GpuControl, min_interval_s: float = 1.0, hold_default_s: float = 60.0) -> None:
        self.gpus = gpus
        self.min_interval_s = min_interval_s
        self.hold_default_s = hold_default_s
        self.history: list[ClockChange] = []
        self._last_change_s: dict[int, float] = {}
        self._current: dict[int, int] = {}
        self._failed_at_s: dict[int, float] = {}

    def clamp(self, index: int, clock_mhz: float) -> int:
        """The highest supported clock at or below the request (the lowest if none)."""
        clocks = self.gpus.supported_clocks_mhz(index)
        pos = bisect.bisect_right(clocks, clock_mhz)
        return clocks[max(pos - 1, 0)]

    def set_clock(self, index: int, clock_mhz: float, now_s: float) -> int | None:
        """Lock GPU `index` near `clock_mhz`; returns the applied clock or None if refused."""
        failed_at = self._failed_at_s.get(index)
        if failed_at is not None and now_s - failed_at < self.hold_default_s:
            self.history.append(ClockChange(now_s, index, int(clock_mhz), None, "held at default after an error"))
            return None
        try:
            target = self.clamp(index, clock_mhz)
            if self._current.get(index) == target:
                return target
            last = self._last_change_s.get(index)
            if last is not None and now_s - last < self.min_interval_s:
                self.history.append(ClockChange(now_s, index, int(clock_mhz), None, "rate limited"))
                return None
            self.gpus.lock_clock(index, target)
        except GpuControlError as exc:
            self.history.append(ClockChange(now_s, index, int(clock_mhz), None, f"failed: {exc}"))
            self._fail_static(index, now_s)
            return None
        self._failed_at_s.pop(index, None)
        self._current[index] = target
        self._last_change_s[index] = now_s
        self.history.append(ClockChange(now_s, index, int(clock_mhz), target, "locked"))
        return target

    def energy_j(self, index: int, now_s: float) -> float | None:
        """GPU `index`'s energy counter; None after an NVML error, which also restores
        default clocks (a GPU we cannot read is one we should not keep throttled)."""
        try:
            return self.gpus.energy_j(index)
        except GpuControlError as exc:
            self.history.append(ClockChange(now_s, index, 0, None, f"read failed: {exc}"))
            self._fail_static(index, now_s)
            return None

    def _fail_static(self, index: int, now_s: float) -> None:
        self._failed_at_s[index] = now_s
        self.restore(index, now_s)

    def restore(self, index: int, now_s: float, why: str = "") -> None:
        """Back to the driver's default clocks; logged (with `why`, where given), never raises."""
        try:
            self.gpus.reset_clock(index)
            note = f"reset to default ({why})" if why else "reset to default"
        except GpuControlError as exc:
            note = f"reset failed: {exc}"
            logger.error("GPU %d: %s", index, note)
        self._current.pop(index, None)
        self.history.append(ClockChange(now_s, index, 0, None, note))

    def restore_all(self, now_s: float) -> None:
        """Reset every GPU; if even the device count fails, the ones this governor locked."""
        try:
            indices = list(range(self.gpus.device_count()))
        except GpuControlError as exc:
            logger.error("GPU count failed (%s); resetting the GPUs this governor locked", exc)
            indices = sorted(self._current)
        for index in indices:
            self.restore(index, now_s)
