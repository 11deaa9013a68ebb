"""Which of a pool's replicas an arriving request joins: of those whose KV cache has room
for its prompt, the one with the least prompt work queued ahead of it, then the shortest
queue.

Join-the-shortest-queue counts requests, and neither of the two things a prompt waits
for. A replica serving a few long requests can be the shortest queue with its KV cache
nearly full: a prompt sent there waits for blocks to free as requests finish (seconds,
against a TTFT target under one) while another replica of the pool has room. And its
first token comes after the prompts queued before it are prefilled. So replicas whose
KV cache would pass `kv_headroom` with the prompt come after those it fits below, each
group by the prompt tokens still to prefill, then by requests. The headroom is the
DynamoLLM planner's (`ShapePlannerConfig.kv_headroom`): the share of the cache it sizes a
replica's steady batch to, beyond which throttLL'eM's clock also runs flat out.

Both runtimes rank with this function: the simulator's dispatch (sim.simulator) and the
Serve pools' request router (deployments.kv_router). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_KV_HEADROOM = 0.8  # also the planner's kv_headroom and throttLL'eM's kv_pressure_share by default


@dataclass(frozen=True)
class ReplicaOccupancy:
    """What routing knows of one replica."""

    requests: int  # waiting + running
    pending_prompt_tokens: float  # prompt tokens it has still to prefill: the work ahead of a new prompt
    kv_tokens_used: float  # tokens its KV cache holds, plus the prompts it has still to prefill
    kv_tokens_total: float  # its KV cache's capacity in tokens (inf: not reported yet)

    @classmethod
    def of(cls, requests: int, kv_blocks_used: int, kv_blocks_total: int, block_size: int,
           pending_prompt_tokens: int) -> ReplicaOccupancy:
        """From a replica's counts: the batcher's own, or its stats as Serve carries them."""
        return cls(requests, pending_prompt_tokens, kv_blocks_used * block_size + pending_prompt_tokens,
                   kv_blocks_total * block_size)

    def has_room(self, prompt_tokens: int, kv_headroom: float) -> bool:
        return self.kv_tokens_used + prompt_tokens <= kv_headroom * self.kv_tokens_total


def rank_replicas(replicas: Sequence[ReplicaOccupancy], prompt_tokens: int,
                  kv_headroom: float = DEFAULT_KV_HEADROOM) -> list[int]:
    """Replica indices best first: room for the prompt below the headroom first, then the
    least prompt work ahead of it, then fewest requests, then index (a stable order)."""
    return sorted(range(len(replicas)), key=lambda i: (not replicas[i].has_room(prompt_tokens, kv_headroom),
                                                       replicas[i].pending_prompt_tokens, replicas[i].requests, i))
