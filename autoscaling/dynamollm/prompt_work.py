"""Prompts longer than the planner was tuned on: a class's load in the requests it was tuned at.

The energy profile prices each length class at one request shape, and the planner's headrooms
were tuned on the Azure conversation trace, whose requests carry per predicted class the
prompts of `TUNED_PROMPT_TOKENS` (predicted, not true, classes: predictions mix a band's
classes, and that mix is what the planner saw). Another workload's prompts may run longer:
Mooncake's long-input classes average 6,000-7,200 tokens where conversation's average
1,765-2,530, and the planner sized its long pool for the first minute at one TP2 replica where
its own catch-up floors soon asked for three. Replicas report each class's prompt tokens with
its arrivals (ReplicaStats.class_prompt_tokens_per_s). A class whose mean prompt runs more than
`deadband` above its reference is planned as that many of the tuned requests. Only upward: a
shorter prompt saves prefill, not the decode its outputs cost, and the one rate scale stands for
both. The mean is read over the planner's long window (`bursty_lookback_s`, 15 min: `PromptWork`),
for prompts that stay long, not for drift the headrooms absorb: conversation's own predicted LM
prompts ran 1.7x the hour's mean for minutes around 1,650 s; read over 2 min, that unfolded the
batch mix's medium pool for the rest of its hour (+30% energy, no SLO to gain), and over one
30-s report code's heavy-tailed prompts held its bursty long pool up (+4.5% on its second half).
From a run's start the window holds what has been seen, so a workload long from the start is
weighed at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

# Mean prompt tokens per *predicted* length class of the Azure conversation trace (the whole
# hour, prompts fitted to an 8,192-token context, output classes from the shipped predictor's
# error, prediction.predictor_confusion): the traffic the planner's headrooms were tuned on.
# tests/unit/autoscaling/test_prompt_work.py derives it again from the trace.
TUNED_PROMPT_TOKENS: dict[str, int] = {
    "SS": 176, "SM": 170, "SL": 169, "MS": 468, "MM": 581, "ML": 608, "LS": 2530, "LM": 1765, "LL": 1770,
}


def prompt_work(reference_tokens: Mapping[str, int], rates_per_s: Mapping[str, float],
                prompt_tokens_per_s: Mapping[str, float], deadband: float) -> dict[str, float]:
    """Per class whose mean prompt exceeds its reference by more than `deadband` (a share):
    that mean over the reference. Classes absent are at the profile's work."""
    work: dict[str, float] = {}
    for cls, rate in rates_per_s.items():
        reference = reference_tokens.get(cls, 0)
        if rate <= 0 or reference <= 0:
            continue
        ratio = prompt_tokens_per_s.get(cls, 0.0) / rate / reference
        if ratio > 1.0 + deadband:
            work[cls] = ratio
    return work


def in_profiled_requests(rates_per_s: Mapping[str, float], work: Mapping[str, float]) -> dict[str, float]:
    """The rates as the profile's requests: each class's rate times its work."""
    return {cls: r * work.get(cls, 1.0) for cls, r in rates_per_s.items()}


class PromptWork:
    """`prompt_work` over the arrivals and prompt tokens of the last `window_s`."""

    def __init__(self, reference_tokens: Mapping[str, int], deadband: float, window_s: float) -> None:
        self.reference_tokens = reference_tokens
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
        return prompt_work(self.reference_tokens, rates, tokens, self.deadband)
