"""The clock the prompts still to prefill on a replica need to meet their TTFT targets.

throttLL'eM's clock search (autoscaling/throttllem/clock.py) projects the requests it
admitted: their TBT and end-to-end deadlines. Prompts waiting behind them are not in its
scoreboard, so in a burst (the coding trace: from silence to 8 long prompts/s within
seconds) the queue grew at the planner's low clock floor until new instances started,
and those prompts missed their TTFT. Here the prompts are taken in the order the batcher
prefills them (`ContinuousBatcher.prefill_queue`: running chunks, then the waiting queue, or
by TTFT deadline where the batcher prefills that way); an interactive prompt
meets its target when every prefill up to and including its own ends by its arrival plus
`headroom` of its TTFT. The prefills are cut into steps of the batcher's token budget,
and each step also decodes the running batch's marginal share (the weight read is paid
by the prefill), so a prompt's first token comes after its prefill time plus that many
decode shares, each stretched by its own compute share at a clock. The clock is the
lowest at which every prompt fits (the top one if none does: as throttLL'eM runs a lost
request, best effort); feasibility only grows with the clock, so a bisection finds it.
"""

from __future__ import annotations

import numpy as np

from batching.continuous_batcher import ContinuousBatcher


def prompt_deadline_clock_mhz(batcher: ContinuousBatcher, clocks_mhz: np.ndarray, now_s: float,
                              headroom: float = 1.0) -> float | None:
    """The lowest of `clocks_mhz` (ascending) at which every interactive prompt still to
    prefill ends its prefill within `headroom` of its TTFT; None when no interactive
    prompt waits for its first token."""
    queue = batcher.prefill_queue()
    waits = np.array([s.request.service_class != "batch" and s.generated == 0 for s in queue], dtype=bool)
    if not waits.any():
        return None
    perf = batcher.perf
    tp = batcher.tensor_parallel
    top = perf.gpu.max_clock_mhz
    left = np.array([s.prefill_target - s.prefilled for s in queue], dtype=float)
    target = np.array([s.prefill_target for s in queue], dtype=float)
    due_s = (np.array([s.request.arrival_s + headroom * s.request.slo.ttft_s for s in queue]) - now_s)[waits]
    # At the top clock (stretch 1), in the batcher's order: prefill time and the steps it spans.
    cum_left = np.cumsum(left)
    prefill_s = np.cumsum(perf.prefill_time_s(left, left * target, tp, top))[waits]
    steps = np.ceil(cum_left / max(batcher.step_tokens, 1))[waits]
    decoding = [s for s in batcher.running if s.prefilled >= s.prefill_target]
    context = float(sum(s.context_tokens for s in decoding))
    decode_share_s = perf.decode_marginal_s(len(decoding), context, tp, top)
    prompt_share, token_share = perf.gpu.prompt_compute_share, perf.gpu.token_compute_share

    def fits(clock_mhz: float) -> bool:
        done_s = (prefill_s * perf.stretch(prompt_share, clock_mhz)
                  + steps * decode_share_s * perf.stretch(token_share, clock_mhz))
        return bool(np.all(done_s <= due_s))

    lo, hi = 0, len(clocks_mhz) - 1
    if not fits(float(clocks_mhz[hi])):
        return float(clocks_mhz[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(float(clocks_mhz[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(clocks_mhz[lo])
