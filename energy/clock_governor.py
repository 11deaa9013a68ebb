"""Safe clock changes: clamp to supported values, rate-limit, record, restore.

Every change costs ~50-200 ms of stalled iterations, so a governor refuses changes
closer together than `min_interval_s` per GPU and skips no-op changes. On any error
it resets the GPU's clocks to the driver default (fail static to max performance).
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
    def __init__(self, gpus: GpuControl, min_interval_s: float = 1.0) -> None:
        self.gpus = gpus
        self.min_interval_s = min_interval_s
        self.history: list[ClockChange] = []
        self._last_change_s: dict[int, float] = {}
        self._current: dict[int, int] = {}

    def clamp(self, index: int, clock_mhz: float) -> int:
        """The highest supported clock at or below the request (the lowest if none)."""
        clocks = self.gpus.supported_clocks_mhz(index)
        pos = bisect.bisect_right(clocks, clock_mhz)
        return clocks[max(pos - 1, 0)]

    def set_clock(self, index: int, clock_mhz: float, now_s: float) -> int | None:
        """Lock GPU `index` near `clock_mhz`; returns the applied clock or None if refused."""
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
            self.restore(index, now_s)
            return None
        self._current[index] = target
        self._last_change_s[index] = now_s
        self.history.append(ClockChange(now_s, index, int(clock_mhz), target, "locked"))
        return target

    def restore(self, index: int, now_s: float) -> None:
        """Back to the driver's default clocks; logged, never raises."""
        try:
            self.gpus.reset_clock(index)
            note = "reset to default"
        except GpuControlError as exc:
            note = f"reset failed: {exc}"
            logger.error("GPU %d: %s", index, note)
        self._current.pop(index, None)
        self.history.append(ClockChange(now_s, index, 0, None, note))

    def restore_all(self, now_s: float) -> None:
        for index in range(self.gpus.device_count()):
            self.restore(index, now_s)
