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
outputs cost, and the one rate scale stands for both.
Pure: rates and tokens in, factors out.
"""

from __future__ import annotations

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
