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

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoscaling.throttllem.clock_search import lowest_passing_index
from batching.continuous_batcher import ClockedBatch


def decode_share_s(batcher: ClockedBatch) -> float:
    """What the running decodes add to each step of a prefill, at the top clock."""
    context, decoding = 0, 0
    for s in batcher.running:
        if s.prefilled >= s.prefill_target:
            context += s.context_tokens
            decoding += 1
    return batcher.perf.decode_marginal_s(decoding, float(context), batcher.tensor_parallel,
                                          batcher.perf.gpu.max_clock_mhz)


class PrefillWork:
    """Prompts prefilled in this order on a replica beside its running decodes: when each
    one's prefill ends, from now, at a clock."""

    def __init__(self, batcher: ClockedBatch, left: np.ndarray, target: np.ndarray,
                 decode_s: float | None = None) -> None:
        """`decode_s`: decode_share_s(batcher), where the caller already has it."""
        perf = batcher.perf
        tp, top = batcher.tensor_parallel, perf.gpu.max_clock_mhz
        self.perf = perf
        # At the top clock (stretch 1), in order: the steps each prefill ends in and the prefill
        # time up to there, whose fixed part each step pays once (chunks of one prompt too).
        self.steps = np.ceil(np.cumsum(left) / max(batcher.step_tokens, 1))
        per_step_s = perf.prefill_time_s(0, 0.0, tp, top)
        self.prefill_s = np.cumsum(perf.prefill_time_s(left, left * target, tp, top) - per_step_s) \
            + self.steps * per_step_s
        self.decode_share_s = decode_share_s(batcher) if decode_s is None else decode_s
        # Each step's overhead does not stretch with the clock; the rest of a prefill does.
        self.overhead_s = perf.prefill_overhead_s(tp)

    @classmethod
    def of_burst(cls, batcher: ClockedBatch, tokens: Sequence[int] | np.ndarray,
                 decode_s: float | None = None) -> PrefillWork:
        """Prompts of `tokens` arriving together, each prefilled whole."""
        whole = np.asarray(tokens, dtype=float)
        return cls(batcher, whole, whole, decode_s)

    def beside(self, decode_s: float) -> PrefillWork:
        """The same prefills beside running decodes that add `decode_s` to each step: a
        burst's prefills stay put while the batch it would join changes step by step."""
        work = copy.copy(self)
        work.decode_share_s = decode_s
        return work

    def _done_s(self, prefill_s: Any, steps: Any, clock_mhz: float) -> Any:
        return (steps * self.overhead_s + (prefill_s - steps * self.overhead_s) * self.perf.work_stretch(
            "prompt", clock_mhz) + steps * self.decode_share_s * self.perf.work_stretch("token", clock_mhz))

    def done_s(self, clock_mhz: float) -> np.ndarray:
        return self._done_s(self.prefill_s, self.steps, clock_mhz)

    def finish_s(self, lag_s: float, present_mhz: float, new_mhz: float) -> np.ndarray:
        """At `present_mhz` for `lag_s` (until a clock chosen now lands), then at `new_mhz`."""
        return self.after_lag(lag_s, present_mhz)(new_mhz)

    def after_lag(self, lag_s: float, present_mhz: float) -> Callable[[float], np.ndarray]:
        """`finish_s` at any new clock, the part at the present clock worked out once: a clock
        search tries several new clocks for the same lag."""
        at_present = self.done_s(present_mhz)
        past_lag = at_present > lag_s
        rest = (at_present - lag_s) / np.where(past_lag, at_present, 1.0)
        return lambda new_mhz: np.where(past_lag, lag_s + rest * self.done_s(new_mhz), at_present)

    def last_finish_s(self, lag_s: float, present_mhz: float, new_mhz: float) -> float:
        """`finish_s(...)[-1]` in scalars (the same arithmetic): a burst's clock search reads
        its last prompt alone, at every clock it tries."""
        prefill_s, steps = float(self.prefill_s[-1]), float(self.steps[-1])
        at_present = self._done_s(prefill_s, steps, present_mhz)
        if at_present <= lag_s:
            return at_present
        return lag_s + (at_present - lag_s) / at_present * self._done_s(prefill_s, steps, new_mhz)


def _lowest_fitting(clocks_mhz: np.ndarray, fits: Callable[[float], bool], hint_mhz: float | None = None) -> float:
    """The lowest of `clocks_mhz` (ascending) that fits, the top one if none does;
    feasibility only grows with the clock. Searched from `hint_mhz` (clock_search)."""
    hint = None if hint_mhz is None else int(np.searchsorted(clocks_mhz, hint_mhz))
    return float(clocks_mhz[lowest_passing_index(0, len(clocks_mhz) - 1, lambda i: fits(float(clocks_mhz[i])), hint)])


def prompt_deadline_clock_mhz(batcher: ClockedBatch, clocks_mhz: np.ndarray, now_s: float,
                              headroom: float = 1.0, hint_mhz: float | None = None) -> float | None:
    """The lowest of `clocks_mhz` (ascending) at which every interactive prompt still to
    prefill ends its prefill within `headroom` of its TTFT; None when no interactive
    prompt waits for its first token. The GPUs run their present clock until a clock
    chosen now lands (`ContinuousBatcher.clock_lands_s`): the work done meanwhile is done
    at that clock, so a prompt already late for the raise asks for more of it. `hint_mhz`: the
    last answer, where the search starts."""
    queue = batcher.prefill_queue(now_s)
    if not queue:
        return None
    # Per prompt in one pass: tokens left, its whole prefill, when it is due, whether it waits.
    rows = np.array([(s.prefill_target - s.prefilled, s.prefill_target,
                      s.request.arrival_s + headroom * s.request.slo.ttft_s,
                      s.request.service_class != "batch" and s.generated == 0) for s in queue], dtype=float)
    waits = rows[:, 3] != 0
    if not waits.any():
        return None
    work = PrefillWork(batcher, rows[:, 0], rows[:, 1])
    due_s = (rows[:, 2] - now_s)[waits]
    finish_s = work.after_lag(batcher.clock_lands_s(now_s) - now_s, batcher.clock_mhz)
    return _lowest_fitting(clocks_mhz, lambda clock: bool(np.all(finish_s(clock)[waits] <= due_s)), hint_mhz)


def burst_ready_clock_mhz(batcher: ClockedBatch, clocks_mhz: np.ndarray, burst: PrefillWork, ttft_s: float,
                          headroom: float = 1.0, hint_mhz: float | None = None) -> float:
    """The lowest clock the GPUs may run at so that a burst (`burst`: the prefills of prompts
    of TTFT target `ttft_s` arriving together just after a clock forward went out, beside the
    running decodes) still ends its prefills within `headroom` of the TTFT once the top clock
    it then asks for lands, a whole forward period plus the lock's latency later. Below it,
    only a clock already high saves such a burst: a raise would come too late. `hint_mhz`:
    the last answer for this target, where the search starts."""
    lag_s, top, due_s = batcher.longest_clock_lag_s, float(clocks_mhz[-1]), headroom * ttft_s
    return _lowest_fitting(clocks_mhz, lambda clock: burst.last_finish_s(lag_s, clock, top) <= due_s, hint_mhz)
