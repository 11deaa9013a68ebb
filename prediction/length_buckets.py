"""Output-length buckets: the classes the length predictor predicts.

Mico §3.2 predicts a bucket, not a length: label = floor(l / (l_max / N)). DynamoLLM
needs short / medium / long at its output thresholds. Both are edge lists here, and
dispatch uses a bucket's midpoint as its length (Mico §3.3: the median of the range).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

from core.classes import LengthClassConfig


@dataclass(frozen=True)
class LengthBuckets:
    """Buckets [edges[i], edges[i+1]) in tokens; lengths >= the last edge fall in the last."""

    edges_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        e = self.edges_tokens
        if len(e) < 3 or e[0] != 0 or any(b <= a for a, b in pairwise(e)):
            raise ValueError(f"bucket edges must start at 0 and increase, with >= 2 buckets: {e}")

    @classmethod
    def uniform(cls, l_max_tokens: int, n: int) -> LengthBuckets:
        """Mico: N buckets of width l_max / N."""
        if n < 2 or l_max_tokens < n:
            raise ValueError("need n >= 2 buckets and l_max_tokens >= n")
        return cls(tuple(round(i * l_max_tokens / n) for i in range(n + 1)))

    @classmethod
    def from_length_classes(cls, lengths: LengthClassConfig, l_max_tokens: int) -> LengthBuckets:
        """DynamoLLM's output sizes S / M / L as three buckets (L capped at l_max for its midpoint)."""
        return cls((0, lengths.output_short_lt, lengths.output_medium_lt,
                    max(l_max_tokens, lengths.output_medium_lt + 1)))

    @property
    def n(self) -> int:
        return len(self.edges_tokens) - 1

    def label(self, length_tokens: int) -> int:
        return min(bisect_right(self.edges_tokens, length_tokens) - 1, self.n - 1)

    def midpoint_tokens(self, bucket: int) -> int:
        """The length dispatch assumes for a bucket: the middle of its range."""
        return (self.edges_tokens[bucket] + self.edges_tokens[bucket + 1]) // 2
