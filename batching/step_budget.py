"""How many tokens one engine step may process: chunked prefill sized to the TBT target.

A step that prefills a whole long prompt stalls every decoding sequence in the batch for
as long as the step takes. On the coding trace, 3,000-token prompts prefilled in one
8,192-token step take 0.2 s at TP2, and a request with a few dozen output tokens misses a
0.1 s mean-TBT target after one or two such gaps, however many replicas the planner holds.
Sarathi-Serve's answer is to size prefill chunks so that a step fits the TBT target; the
one controller does the same per replica, from the perf model every runtime shares.

A replica's budget follows its clock: a lower clock makes a step of the same tokens longer,
so the budget shrinks with it, and a step stays within the target at any clock. That also
bounds what a short prompt waits behind a long one's chunks where prompts prefill by TTFT
deadline (one step). vLLM fixes `max_num_batched_tokens` when an engine starts, so its pools
take the budget at the GPU's top clock (serve_config.gpu.yaml). The fluid model
the planner costs shapes with charges each prompt's prefill once whatever its chunks, so
the planner and the batchers agree on the work; chunking only spreads it over steps.
"""

from __future__ import annotations

from energy.perf_model import PerfModel

# Budgets a replica may get: powers of two, like the values vLLM users set.
STEP_TOKEN_CHOICES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def tbt_bounded_step_tokens(perf: PerfModel, tp: int, step_time_s: float, ceiling: int,
                            clock_mhz: float | None = None) -> int:
    """The largest choice up to `ceiling` whose step, prefilling that many tokens of a
    fresh prompt, fits in `step_time_s` at TP `tp` and `clock_mhz` (None: the top clock);
    the smallest choice (or `ceiling`, if lower) when none fits, so prefill always progresses."""
    clock = perf.gpu.max_clock_mhz if clock_mhz is None else clock_mhz
    fitting = [n for n in STEP_TOKEN_CHOICES if n <= ceiling
               and perf.iteration(n, float(n) * n, 0, 0, tp, clock).time_s <= step_time_s]
    return max(fitting, default=min(STEP_TOKEN_CHOICES[0], ceiling))
