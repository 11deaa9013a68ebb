"""What a run records: one row per request, one sample per interval.

Arrays are preallocated per request index, so recording a completion is a few
stores and a week-long trace does not build millions of Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from batching.continuous_batcher import Sequence
from core.classes import LengthClassConfig
from core.slo_outcomes import mean_tbt_s

CLASS_NAMES = LengthClassConfig.names()
CLASS_INDEX = {name: i for i, name in enumerate(CLASS_NAMES)}


class RequestLog:
    """Per-request outcome; TBT kept both as the request's worst gap and its mean gap."""

    def __init__(self, n: int) -> None:
        self.done = np.zeros(n, dtype=bool)
        self.rejected = np.zeros(n, dtype=bool)
        self.ttft_s = np.full(n, np.nan)
        self.e2e_s = np.full(n, np.nan)
        self.max_tbt_s = np.full(n, np.nan)
        self.mean_tbt_s = np.full(n, np.nan)
        self.energy_j = np.zeros(n)
        self.prompt_tokens = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)  # of the prompt, found in its replica's prefix cache
        self.output_tokens = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.slo_ttft_s = np.full(n, np.nan)
        self.slo_tbt_s = np.full(n, np.nan)
        self.slo_e2e_s = np.full(n, np.nan)  # its SLO's E2E deadline for the tokens it generated
        self.length_class = np.zeros(n, dtype=np.int8)
        self.interactive = np.zeros(n, dtype=bool)
        self.pool = np.zeros(n, dtype=np.int16)

    def __len__(self) -> int:
        return len(self.done)

    def finish(self, i: int, seq: Sequence) -> None:
        if self.done[i]:
            raise RuntimeError(f"request {i} finished twice")
        arrival = seq.request.arrival_s
        first = seq.first_token_s if seq.first_token_s is not None else arrival
        last = seq.last_token_s if seq.last_token_s is not None else first
        self.done[i] = True
        self.ttft_s[i] = first - arrival
        self.e2e_s[i] = last - arrival
        self.max_tbt_s[i] = seq.max_tbt_s
        self.mean_tbt_s[i] = mean_tbt_s(first, last, seq.generated)
        self.energy_j[i] = seq.energy_j
        self.output_tokens[i] = seq.generated
        self.slo_e2e_s[i] = seq.request.slo.e2e_for(seq.generated)
        self.preemptions[i] = seq.preemptions
        self.cached_tokens[i] = seq.cached_tokens


@dataclass
class Series:
    """Samples every `interval_s`: cluster energy so far and, per pool, its shape."""

    interval_s: float
    t_s: list[float] = field(default_factory=list)
    energy_j: list[float] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    ready: dict[str, list[int]] = field(default_factory=dict)
    starting: dict[str, list[int]] = field(default_factory=dict)
    tp: dict[str, list[int]] = field(default_factory=dict)
    clock_mhz: dict[str, list[float]] = field(default_factory=dict)
    queued: dict[str, list[int]] = field(default_factory=dict)

    def power_w(self) -> np.ndarray:
        """Mean cluster power over each interval ending at a sample."""
        e = np.asarray(self.energy_j)
        t = np.asarray(self.t_s)
        if len(e) < 2:
            return np.zeros(len(e))
        return np.concatenate([[0.0], np.diff(e) / np.maximum(np.diff(t), 1e-9)])
