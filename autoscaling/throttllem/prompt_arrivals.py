"""The interactive prompts of one TTFT target seen arriving at a replica, oldest first, and
the largest burst among them: the most prompt tokens arriving within one clock raise's lag,
which throttLL'eM's clock stays ready for (autoscaling/throttllem/clock.py).

The burst is read at every clock refresh over the last minute of arrivals (hundreds on a
busy replica), so it is kept up to date as arrivals come and go rather than searched again:
each arrival's window (the arrivals within the lag before it, itself included) is counted
once, and a queue holds the windows that can still be the largest, largest first. A window
that another later one outweighs never becomes the largest again: forgetting old arrivals
takes at least as many tokens from the earlier window as from the later one (its start is no
later), and it is forgotten first.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Burst:
    """The prompt tokens of the arrivals in the largest window. `first` counts its first
    arrival from the first ever added: two bursts with the same `first` and length are the
    same prompts."""

    first: int
    tokens: np.ndarray


class PromptArrivals:
    def __init__(self) -> None:
        self._at_s: list[float] = []
        self._tokens: list[int] = []
        # Indices count arrivals from the first ever added; lists hold those from `_base` on.
        self._base = 0
        self._held = [0]  # the tokens of every arrival before each index, from `_base` on
        self._first: list[int] = []  # each ranked arrival's window start, when it was ranked
        # Arrival indices whose windows may still be the largest, their tokens non-increasing
        # (the earlier first on a tie), for `_lag_s`; arrivals from `_ranked` on are not in yet.
        self._lag_s: float | None = None
        self._queue: deque[int] = deque()
        self._ranked = 0
        self._burst: Burst | None = None

    def add(self, at_s: float, tokens: int) -> None:
        """A prompt that arrived at `at_s`, no earlier than the last one added."""
        self._at_s.append(at_s)
        self._tokens.append(tokens)
        self._held.append(self._held[-1] + tokens)

    def forget_before(self, horizon_s: float) -> bool:
        """Drop the arrivals before `horizon_s`; whether any are left."""
        gone = bisect_left(self._at_s, horizon_s)
        if gone:
            del self._at_s[:gone], self._tokens[:gone], self._held[:gone], self._first[:gone]
            self._base += gone
            self._ranked = max(self._ranked, self._base)
        return bool(self._at_s)

    def _window_tokens(self, i: int) -> int:
        """The tokens of arrival i's window among the arrivals not forgotten."""
        base = self._base
        return self._held[i + 1 - base] - self._held[max(self._first[i - base], base) - base]

    def largest_burst(self, lag_s: float) -> Burst | None:
        """The arrivals within `lag_s` of each other holding the most tokens (the earliest such
        window on a tie), None when no prompt has any. The same object while it is the same."""
        if lag_s != self._lag_s:
            self._lag_s, self._queue, self._ranked, self._first = lag_s, deque(), self._base, []
        base, queue, window = self._base, self._queue, self._window_tokens
        while queue and queue[0] < base:
            queue.popleft()
        # Windows reaching back before `base` lost their forgotten tokens: they lead the queue.
        cut = []
        while queue and self._first[queue[0] - base] < base:
            cut.append(queue.popleft())
        for i in reversed(cut):
            if not queue or window(i) >= window(queue[0]):
                queue.appendleft(i)
        for i in range(self._ranked, base + len(self._at_s)):
            self._first.append(base + bisect_left(self._at_s, self._at_s[i - base] - lag_s))
            tokens = window(i)
            while queue and window(queue[-1]) < tokens:
                queue.pop()
            queue.append(i)
        self._ranked = base + len(self._at_s)
        if not queue or window(queue[0]) <= 0:
            return None
        last = queue[0]
        first = max(self._first[last - base], base)
        burst = self._burst
        if burst is None or burst.first != first or len(burst.tokens) != last + 1 - first:
            burst = self._burst = Burst(first, np.array(self._tokens[first - base:last + 1 - base], dtype=np.int64))
        return burst
