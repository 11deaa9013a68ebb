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
take the budget at the GPU's top clock (serve_config.gpu.yaml).

The budget counts tokens, sized for a fresh chunk's step alone; a chunk deep into its prompt
or beside many decodes takes longer. So the batcher costs each step it plans and trims its
chunks (fit_chunks_to_step_time) to the target, or beyond it only as far as every interactive
request decoding in the step has banked time under its mean-TBT target since its first token
(batch work has deadlines, not a TBT: beside batch decodes alone a chunk is not trimmed).
vLLM's scheduler keeps its fixed budget. The fluid model the planner costs shapes with
charges each prompt's prefill once whatever its chunks, so the planner and the batchers
agree on the work; chunking only spreads it over steps.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    return max(fitting, default=progress_tokens(ceiling))


def progress_tokens(ceiling: int) -> int:
    """The prefill tokens a step takes however long it runs, so that prefill always progresses."""
    return min(STEP_TOKEN_CHOICES[0], ceiling)


def prefill_sum_sq(chunks: Iterable[tuple[int, int]]) -> int:
    """The attention work of prefill `chunks`, each (tokens already prefilled, tokens now): what
    PerfModel.iteration's `prefill_sum_sq` takes."""
    return sum(n * (done + n) for done, n in chunks)


def step_time_s(perf: PerfModel, tp: int, clock_mhz: float, chunks: list[tuple[int, int]],
                decodes: int, decode_context: int) -> float:
    """One step's time: `chunks` as (tokens already prefilled, tokens now), beside `decodes`
    sequences holding `decode_context` tokens."""
    tokens = sum(n for _, n in chunks)
    return perf.iteration(tokens, float(prefill_sum_sq(chunks)), decodes, decode_context, tp, clock_mhz).time_s


def fit_chunks_to_step_time(perf: PerfModel, tp: int, clock_mhz: float, chunks: list[tuple[int, int]],
                            decodes: int, decode_context: int, target_s: float, ceiling: int) -> list[int]:
    """Each chunk's tokens, trimmed from the last chunk back, so that the step fits `target_s`.

    The token budget is the step of a fresh chunk alone. A chunk deep into its prompt (its
    attention reads what is already prefilled) or beside many decodes takes longer: on the
    coding trace a 1,021-token chunk after 510 prefilled tokens, beside 3 decodes, took 103 ms
    against a 100 ms target, and a 6-token answer decoding beside it missed its mean TBT.
    Prefill still progresses: the chunks keep at least progress_tokens(`ceiling`) between them
    (or all they had, if fewer)."""
    sizes = [n for _, n in chunks]
    floor_left = min(progress_tokens(ceiling), sum(sizes))

    def fits() -> bool:
        kept = [(done, n) for (done, _), n in zip(chunks, sizes, strict=True) if n > 0]
        return step_time_s(perf, tp, clock_mhz, kept, decodes, decode_context) <= target_s

    for i in range(len(sizes) - 1, -1, -1):
        if fits():
            break
        before = sum(sizes[:i])
        low = max(floor_left - before, 0)  # the fewest this chunk may keep
        original = sizes[i]
        sizes[i] = low
        if not fits():
            continue  # even its fewest is too long: trim the chunks before it too
        hi = original  # invariant: sizes[i] = low fits, hi does not
        while hi - low > 1:
            mid = (low + hi) // 2
            sizes[i] = mid
            if fits():
                low = mid
            else:
                hi = mid
        sizes[i] = low
        break
    return sizes
