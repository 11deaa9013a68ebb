"""Arrivals per length class over a trailing window (DynamoLLM's per-class load signal)."""

from __future__ import annotations

from collections import Counter, deque


class ArrivalRates:
    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, str]] = deque()

    def add(self, now_s: float, length_class: str) -> None:
        self._arrivals.append((now_s, length_class))

    def per_s(self, now_s: float) -> dict[str, float]:
        while self._arrivals and self._arrivals[0][0] < now_s - self.window_s:
            self._arrivals.popleft()
        return {cls: n / self.window_s for cls, n in Counter(c for _, c in self._arrivals).items()}
