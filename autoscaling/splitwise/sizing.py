"""First guess at prompt and token pool sizes for a load (before the simulator refines it).

Prompt machines are busy rate x prefill time, kept under the capacity model's
utilisation cap; token machines decode at the largest batch the TBT target and KV
allow, and each carries batch / iteration-time tokens per second.
"""

from __future__ import annotations

import math

from energy.capacity import CapacityModel, Load


def prompt_replicas(cap: CapacityModel, tp: int, clock_mhz: float, load: Load) -> int:
    busy = load.rate_per_s * cap.prefill_s(tp, clock_mhz, load.mean_prompt_tokens)
    return max(math.ceil(busy / cap.max_utilisation), 1)


def token_replicas(cap: CapacityModel, tp: int, clock_mhz: float, load: Load, tbt_s: float) -> int:
    ctx = load.mean_context_tokens
    batch = cap.max_batch(tp, clock_mhz, ctx, tbt_s)
    tokens_per_s = batch / cap.decode_iteration_s(tp, clock_mhz, batch, ctx)
    return max(math.ceil(load.rate_per_s * load.mean_output_tokens / tokens_per_s), 1)
