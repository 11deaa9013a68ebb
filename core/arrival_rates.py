"""Arrivals per length class over a trailing window (DynamoLLM's per-class load signal),
how many of them were batch work (Chiron: batch load can wait for spare capacity), and their
prompt tokens (a class's prompts may run longer than the profile it is planned on assumes)."""

from __future__ import annotations

from collections import Counter, deque

# The one window replicas measure arrival rates over. The planner reads a new pool's ramp from
# it (its reported rates climb from zero over this long), so it is a constant, not two settings
# that must agree.
RATE_WINDOW_S = 30.0


class ArrivalRates:
    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, str, bool, int]] = deque()

    def add(self, now_s: float, length_class: str, batch: bool = False, prompt_tokens: int = 0) -> None:
        self._arrivals.append((now_s, length_class, batch, prompt_tokens))

    def _trim(self, now_s: float) -> None:
        while self._arrivals and self._arrivals[0][0] < now_s - self.window_s:
            self._arrivals.popleft()

    def per_s(self, now_s: float) -> dict[str, float]:
        self._trim(now_s)
        return {cls: n / self.window_s for cls, n in Counter(c for _, c, _, _ in self._arrivals).items()}

    def batch_per_s(self, now_s: float) -> float:
        self._trim(now_s)
        return sum(1 for _, _, batch, _ in self._arrivals if batch) / self.window_s

    def prompt_tokens_per_s(self, now_s: float) -> dict[str, float]:
        self._trim(now_s)
        tokens: Counter[str] = Counter()
        for _, cls, _, prompt in self._arrivals:
            tokens[cls] += prompt
        return {cls: n / self.window_s for cls, n in tokens.items()}
