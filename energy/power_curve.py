"""Decode power over load, as measured, instead of one constant per phase.

A decode step streams the weights once (memory-bound, the same at any batch) and then
does per-sequence work (attention over the KV cache, wider GEMMs) that keeps the SMs
busier as the batch grows. ML.ENERGY's sweeps show per-GPU power rising with batch and
levelling off near TDP (70B on 4xH100: 441 W at batch 8, 636 W at 768), linearly in the
share of the step spent on per-sequence work. That share comes from the latency fit, so
the curve needs two fitted numbers and a ceiling. It holds at the clock it was measured
at (the GPU's default, i.e. max boost); PerfModel applies the DVFS model on top.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodePowerCurve:
    """Per-GPU decode power at max clock: min(base_w + per_seq_w * share, ceiling_w), where
    share = (d1 * batch + d2 * context) / decode_ms is the per-sequence part of the step."""

    base_w: float  # a step that only streams the weights (share 0)
    per_seq_w: float  # extra power when the step is all per-sequence work (share 1)
    ceiling_w: float  # the board power limit (TDP)

    def power_w(self, per_seq_share: float) -> float:
        return min(self.base_w + self.per_seq_w * per_seq_share, self.ceiling_w)

    @property
    def saturated_w(self) -> float:
        """Power at very large batch: what a caller that knows no batch is charged."""
        return self.power_w(1.0)
