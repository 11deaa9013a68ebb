"""Overflow between length-class pools in a burst: a request whose pool is backed up goes
to another serving pool with room, tried in order, before it queues at home.

DynamoLLM sends each class to its pool and sizes the pool for its trailing peak. A burst
beyond that peak (the coding trace's on/off traffic; any app's first minutes, before the
planner has seen its load) queues prompts for the half minute new instances take to
start, while other pools' replicas may have room. Splitwise routes each request to the
machine with the shortest queue; here a replica tells its router, as it takes the
request, that it is backed up (`Request.refuse_above_pending_tokens`, checked by the
batcher and by the vLLM engine against the prompt tokens they still have to prefill),
and the router tries the next pool. Interactive requests only: batch work waits by design.

Both runtimes walk the same attempts: the simulator against its replicas, the Serve
ingress through the replicas' refusals (a refusal before the first token, answered at
once). Pools are tried in the app's pool order; a pool with no replica running is passed
over by an attempt that may be refused.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class PoolOverflowConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(default=True, description=(
        "An interactive request whose pool is backed up tries the other serving pools first."))
    backed_up_tokens: int = Field(default=16000, gt=0, description=(
        "A replica with more prompt tokens than this still to prefill refuses a request that "
        "has another pool to try; a replica of that other pool takes it only under half of it. "
        "Chosen on the coding trace's first half (`e83812b`); 8k, 12k and 24k tried on held-out loads "
        "(docs/results/2026-11-28-held-out-loads.md)."))


@dataclass(frozen=True)
class Attempt:
    """Send the request to `pool`; its replica refuses it above `refuse_above_pending_tokens`
    prompt tokens still to prefill (None: it queues there)."""

    pool: str
    refuse_above_pending_tokens: int | None


def overflow_attempts(pool: str, service_class: str, serving: Sequence[str],
                      config: PoolOverflowConfig | None) -> list[Attempt]:
    """Where to try a request routed to `pool`, in order: `pool` unless backed up, each other
    pool of `serving` (the pools routing sends classes to, in the app's order) with room,
    then `pool` for good."""
    helpers = [p for p in serving if p != pool]
    if config is None or not config.enabled or service_class == "batch" or not helpers:
        return [Attempt(pool, None)]
    room = config.backed_up_tokens // 2
    return [Attempt(pool, config.backed_up_tokens), *(Attempt(p, room) for p in helpers), Attempt(pool, None)]


def serving_pools(weights: dict[str, dict[str, float]], order: Collection[str]) -> list[str]:
    """The pools of `order` that routing `weights` (class -> pool -> weight) send a class to."""
    routed = {pool for by_pool in weights.values() for pool, w in by_pool.items() if w > 0}
    return [pool for pool in order if pool in routed]
