"""Per-class load forecasts for the cluster manager's next epoch (pluggable).

The default keeps a weekly template (DynamoLLM's "lightweight load templates"): one
slot per epoch of the week holding an EWMA of the peak rate seen in that slot in past
weeks. The forecast for the next epoch is the larger of that slot's template and the
peak of the epoch that just ended, so a new surge is never planned away.
"""

from __future__ import annotations

from typing import Protocol

WEEK_S = 7 * 24 * 3600.0


class LoadPredictor(Protocol):
    def observe(self, length_class: str, rate_per_s: float, now_s: float) -> None: ...

    def predict_peak(self, length_class: str, now_s: float, horizon_s: float) -> float: ...


class WeeklyTemplatePredictor:
    def __init__(self, slot_s: float = 1800.0, alpha: float = 0.5) -> None:
        self.slot_s = slot_s
        self.alpha = alpha
        self._template: dict[tuple[str, int], float] = {}
        self._current_peak: dict[str, float] = {}
        self._last_peak: dict[str, float] = {}
        self._slot: int | None = None

    def _slot_of(self, now_s: float) -> int:
        return int((now_s % WEEK_S) // self.slot_s)

    def observe(self, length_class: str, rate_per_s: float, now_s: float) -> None:
        slot = self._slot_of(now_s)
        if self._slot is not None and slot != self._slot:
            self._close_slot(self._slot)
        self._slot = slot
        self._current_peak[length_class] = max(self._current_peak.get(length_class, 0.0), rate_per_s)

    def _close_slot(self, slot: int) -> None:
        for cls, peak in self._current_peak.items():
            old = self._template.get((cls, slot))
            self._template[(cls, slot)] = peak if old is None else old + self.alpha * (peak - old)
        self._last_peak = self._current_peak
        self._current_peak = {}

    def predict_peak(self, length_class: str, now_s: float, horizon_s: float) -> float:
        recent = max(self._current_peak.get(length_class, 0.0), self._last_peak.get(length_class, 0.0))
        slots = range(self._slot_of(now_s), self._slot_of(now_s + max(horizon_s - 1e-9, 0.0)) + 1)
        template = max((self._template.get((length_class, s), 0.0) for s in slots), default=0.0)
        return max(recent, template)
