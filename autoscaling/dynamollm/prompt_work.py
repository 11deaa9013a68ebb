"""Prompts longer than the profile's: a class's load counted in the requests it was profiled at.

The energy profile prices each length class at one request shape (EnergyProfile.class_shapes:
by default the Azure conversation trace's mean prompt and output per class). A class's prompts
may run longer on another workload: Mooncake's long-input classes average 6,000-7,200 prompt
tokens where the profile's long band runs at most 2,979, and the planner sized its long pool
for the first minute at one TP2 replica where its own catch-up floors soon asked for three.
Replicas report each class's prompt tokens with its arrivals
(ReplicaStats.class_prompt_tokens_per_s). The reference is the longest prompt the class's
input band was profiled at, not the class's own: the classes are predicted, and predictions mix
a band's classes (on conversation itself, requests predicted LL average 1,900 prompt tokens
against LL's profiled 1,111; a per-class reference cost 31% more energy there for no SLO). A
class whose mean prompt runs more than `deadband` above that reference is planned as that many
of the profile's requests. Only upward: a shorter prompt saves prefill, not the decode its
outputs cost, and the one rate scale stands for both. The mean is read over the planner's
trailing window (`PromptWork`), not one 30-s report: a bursty pool is planned at its peak
over 15 min, and one window's few long prompts would hold it there (on code's second half
the per-report factor fired in 9-25% of the long classes' plans, at 1.3-2x, and drew 4.5%
more energy for no SLO).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


def prompt_work(class_shapes: Mapping[str, tuple[int, int]], rates_per_s: Mapping[str, float],
                prompt_tokens_per_s: Mapping[str, float], deadband: float) -> dict[str, float]:
    """Per class whose mean prompt exceeds its input band's longest profiled prompt by more than
    `deadband` (a share): that mean over that prompt. Classes absent are at the profile's work."""
    longest: dict[str, int] = {}  # input band (the class's first letter) -> its longest profiled prompt
    for cls, (prompt, _) in class_shapes.items():
        longest[cls[0]] = max(longest.get(cls[0], 0), prompt)
    work: dict[str, float] = {}
    for cls, rate in rates_per_s.items():
        profiled = longest.get(cls[0], 0)
        if rate <= 0 or profiled <= 0:
            continue
        ratio = prompt_tokens_per_s.get(cls, 0.0) / rate / profiled
        if ratio > 1.0 + deadband:
            work[cls] = ratio
    return work


def in_profiled_requests(rates_per_s: Mapping[str, float], work: Mapping[str, float]) -> dict[str, float]:
    """The rates as the profile's requests: each class's rate times its work."""
    return {cls: r * work.get(cls, 1.0) for cls, r in rates_per_s.items()}


class PromptWork:
    """`prompt_work` over the arrivals and prompt tokens of the last `window_s`."""

    def __init__(self, class_shapes: Mapping[str, tuple[int, int]], deadband: float, window_s: float) -> None:
        self.class_shapes = class_shapes
        self.deadband = deadband
        self.window_s = window_s
        self._seen: deque[tuple[float, Mapping[str, float], Mapping[str, float]]] = deque()

    def observe(self, now_s: float, rates_per_s: Mapping[str, float],
                prompt_tokens_per_s: Mapping[str, float]) -> dict[str, float]:
        """The work per class over the window, this report included."""
        self._seen.append((now_s, rates_per_s, prompt_tokens_per_s))
        while self._seen[0][0] < now_s - self.window_s:
            self._seen.popleft()
        rates: dict[str, float] = {}
        tokens: dict[str, float] = {}
        for _, r, t in self._seen:
            for cls, x in r.items():
                rates[cls] = rates.get(cls, 0.0) + x
            for cls, x in t.items():
                tokens[cls] = tokens.get(cls, 0.0) + x
        return prompt_work(self.class_shapes, rates, tokens, self.deadband)
