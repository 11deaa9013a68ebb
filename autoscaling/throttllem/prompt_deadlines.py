"""The clock the prompts still to prefill on a replica need to meet their TTFT targets.

throttLL'eM's clock search (autoscaling/throttllem/clock.py) projects the requests it
admitted: their TBT and end-to-end deadlines. Prompts waiting behind them are not in its
scoreboard, so in a burst (the coding trace: from silence to 8 long prompts/s within
seconds) the queue grew at the planner's low clock floor until new instances started,
and those prompts missed their TTFT. Here the prompts are taken in the order the batcher
prefills them (running chunks first, then the waiting queue, FCFS); an interactive prompt
meets its target when every prefill up to and including its own ends by its arrival plus
its TTFT. Prefill time scales with the clock as the perf model's `stretch`, so one pass
finds the largest stretch every prompt tolerates, and the clock is the lowest that fits
it (the top one if none does: as throttLL'eM runs a lost request, best effort). Decode
steps interleaved with the chunks are left out: the clock is a floor, and the planner's
instances carry the decodes.
"""

from __future__ import annotations

import numpy as np

from batching.continuous_batcher import ContinuousBatcher


def prompt_deadline_clock_mhz(batcher: ContinuousBatcher, clocks_mhz: np.ndarray, now_s: float) -> float | None:
    """The lowest of `clocks_mhz` (ascending) at which every interactive prompt still to
    prefill ends its prefill within its TTFT; None when no interactive prompt waits."""
    queue = [s for s in (*batcher.running, *batcher.waiting) if s.prefilled < s.prefill_target]
    waits = np.array([s.request.service_class != "batch" and s.generated == 0 for s in queue], dtype=bool)
    if not waits.any():
        return None
    perf = batcher.perf
    left = np.array([s.prefill_target - s.prefilled for s in queue], dtype=float)
    target = np.array([s.prefill_target for s in queue], dtype=float)
    due_s = np.array([s.request.arrival_s + s.request.slo.ttft_s for s in queue]) - now_s
    # Cumulative prefill time at the top clock (stretch 1), in the batcher's order.
    done_s = np.cumsum(perf.prefill_time_s(left, left * target, batcher.tensor_parallel, perf.gpu.max_clock_mhz))
    tolerated = float(np.min(due_s[waits] / done_s[waits]))
    share = perf.gpu.prompt_compute_share
    return float(next((c for c in clocks_mhz if perf.stretch(share, c) <= tolerated), clocks_mhz[-1]))
