"""The interactive prompts of one TTFT target seen arriving at a replica, oldest first, and
the largest burst among them: the most prompt tokens arriving within one clock raise's lag,
which throttLL'eM's clock stays ready for (autoscaling/throttllem/clock.py).

The burst is read at every clock refresh over the last minute of arrivals (hundreds on a
busy replica), so it is one vectorised pass: a window ending at each arrival starts at the
first arrival within the lag before it.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


class PromptArrivals:
    def __init__(self) -> None:
        self._at_s: list[float] = []
        self._tokens: list[int] = []

    def add(self, at_s: float, tokens: int) -> None:
        """A prompt that arrived at `at_s`, no earlier than the last one added."""
        self._at_s.append(at_s)
        self._tokens.append(tokens)

    def forget_before(self, horizon_s: float) -> bool:
        """Drop the arrivals before `horizon_s`; whether any are left."""
        gone = bisect_left(self._at_s, horizon_s)
        if gone:
            del self._at_s[:gone], self._tokens[:gone]
        return bool(self._at_s)

    def largest_burst(self, lag_s: float) -> np.ndarray | None:
        """The prompt tokens of the arrivals within `lag_s` of each other holding the most
        tokens (the earliest such window on a tie), None when no prompt has any."""
        if not self._at_s:
            return None
        at_s = np.array(self._at_s)
        tokens = np.array(self._tokens, dtype=np.int64)
        held = np.concatenate(([0], np.cumsum(tokens)))
        first = np.searchsorted(at_s, at_s - lag_s, side="left")
        totals = held[1:] - held[first]
        last = int(np.argmax(totals))
        if totals[last] <= 0:
            return None
        return tokens[first[last]:last + 1]
