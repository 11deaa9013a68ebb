"""Which of a pool's replicas an arriving request joins: of those whose KV cache has room
for its prompt, the one with the least prompt work queued ahead of it, then the shortest
queue.

Join-the-shortest-queue counts requests, and neither of the two things a prompt waits
for. A replica serving a few long requests can be the shortest queue with its KV cache
nearly full: a prompt sent there waits for blocks to free as requests finish (seconds,
against a TTFT target under one) while another replica of the pool has room. And its
first token comes after the prompts queued before it are prefilled. So replicas whose
KV cache would pass the KV budget (core.kv_budget) with the prompt come after those it fits
below, each group by the prompt tokens still to prefill, then by requests.

With prefix affinity (a pool whose router is "prefix_aware"), replicas holding more of the
prompt's prefix blocks come first: a prefill skipped is time and energy not spent. Bounded by
load, as Ray Serve LLM's PrefixCacheAffinityRouter bounds it: only replicas with room and at
most `imbalance_requests` more requests than the least loaded one with room may win by
affinity, and only for a match of at least `min_match` of the prompt; the rest, and ties,
go by the KV-room rank above. So no replica takes everything because it holds a popular prefix.

Both runtimes rank with this function: the simulator's dispatch (sim.simulator) and the
Serve pools' request router (deployments.kv_router). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from core.kv_budget import KV_BUDGET


@dataclass(frozen=True)
class ReplicaOccupancy:
    """What routing knows of one replica."""

    requests: int  # waiting + running
    pending_prompt_tokens: float  # prompt tokens it has still to prefill: the work ahead of a new prompt
    kv_tokens_used: float  # tokens its KV cache holds, plus the prompts it has still to prefill
    kv_tokens_total: float  # its KV cache's capacity in tokens (inf: not reported yet)
    cached_prompt_tokens: float = 0.0  # of the prompt being routed, what it holds (its prefix blocks)

    @classmethod
    def of(cls, requests: int, kv_blocks_used: int, kv_blocks_total: int, block_size: int,
           pending_prompt_tokens: int) -> ReplicaOccupancy:
        """From a replica's counts: the batcher's own, or its stats as Serve carries them."""
        return cls(requests, pending_prompt_tokens, kv_blocks_used * block_size + pending_prompt_tokens,
                   kv_blocks_total * block_size)

    def has_room(self, prompt_tokens: int, kv_budget: float) -> bool:
        return self.kv_tokens_used + prompt_tokens <= kv_budget * self.kv_tokens_total


class PrefixAffinity(BaseModel):
    """How far prefix affinity may pull a request away from the least loaded replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    imbalance_requests: float = Field(default=4.0, ge=0, description=(
        "A replica with more requests than this above the least loaded replica with room wins by "
        "no prefix (the idea of Ray Serve LLM's imbalanced_threshold, whose default is unbounded). "
        "4, the tightest bound that met the target on Mooncake (`5b55981`, "
        "docs/results/2026-12-05-prefix-routing.md)."))
    min_match: float = Field(default=0.1, ge=0, le=1, description=(
        "The least share of the prompt a replica must hold to win by it (Ray Serve LLM's "
        "match_rate_threshold)."))

    @classmethod
    def unbounded(cls) -> PrefixAffinity:
        """The most cached prefix wins whatever the load: the hit rate's upper reference."""
        return cls(imbalance_requests=math.inf, min_match=0.0)


def rank_replicas(replicas: Sequence[ReplicaOccupancy], prompt_tokens: int,
                  kv_budget: float = KV_BUDGET, affinity: PrefixAffinity | None = None) -> list[int]:
    """Replica indices best first: with `affinity`, the replicas it lets win by the prompt's
    cached prefix, most cached first; then room for the prompt within the KV budget, the least
    prompt work ahead of it, fewest requests, index (a stable order)."""
    room = [r.has_room(prompt_tokens, kv_budget) for r in replicas]
    won = [0.0] * len(replicas)
    if affinity is not None and prompt_tokens > 0:
        least = min((r.requests for r, ok in zip(replicas, room, strict=True) if ok), default=0)
        won = [r.cached_prompt_tokens if ok and r.requests <= least + affinity.imbalance_requests
               and r.cached_prompt_tokens >= affinity.min_match * prompt_tokens else 0.0
               for r, ok in zip(replicas, room, strict=True)]
    return sorted(range(len(replicas)), key=lambda i: (-won[i], not room[i], replicas[i].pending_prompt_tokens,
                                                       replicas[i].requests, i))
