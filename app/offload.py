"""Back-off offloading (Mico §3.3): an idle cluster takes queued work from busy ones.

Prediction errors can still leave one cluster with the most work. A cluster that has
drained its queue announces it; a cluster with queries still waiting hands over the
last of them while each would start sooner on the idle cluster, transfer included, than
where it waits. Pure: the runtime supplies loads and rates, and moves the requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """A query queued (not started) on a cluster, in queue order."""

    request_id: str
    cost_tokens: float
    prompt_tokens: int


@dataclass(frozen=True)
class ClusterLoad:
    """What a cluster tells its peers: work ahead of its queue, its queue, its speed."""

    cluster: int
    running_tokens: float  # work left in its running batch
    waiting: Sequence[Waiting]
    tokens_per_s: float


@dataclass(frozen=True)
class TransferCost:
    """Time to move a query between clusters: a round trip plus its prompt over the link."""

    rtt_s: float = 0.05
    bytes_per_token: float = 4.0
    bandwidth_bytes_per_s: float = 1e8

    def seconds(self, prompt_tokens: int) -> float:
        return self.rtt_s + prompt_tokens * self.bytes_per_token / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Move:
    request_id: str
    from_cluster: int
    to_cluster: int


def offload_to_idle(idle: ClusterLoad, busy: Sequence[ClusterLoad], transfer: TransferCost) -> list[Move]:
    """Moves from the busiest queue's tail to `idle` while each pays for itself.

    A query's queueing delay where it waits is the work ahead of it over its cluster's
    rate; on the idle cluster, the work moved before it over the idle cluster's rate.
    It moves only if that plus the transfer time is shorter."""
    moves: list[Move] = []
    if idle.tokens_per_s <= 0:
        return moves
    moved_tokens = idle.running_tokens + sum(w.cost_tokens for w in idle.waiting)
    for src in sorted(busy, key=lambda c: -_start_delays_s(c)[-1]):
        if src.tokens_per_s <= 0:
            continue
        delays = _start_delays_s(src)
        for pos in range(len(src.waiting) - 1, -1, -1):
            query = src.waiting[pos]
            stay_s = delays[pos]
            go_s = moved_tokens / idle.tokens_per_s + transfer.seconds(query.prompt_tokens)
            if go_s >= stay_s:
                break
            moves.append(Move(query.request_id, src.cluster, idle.cluster))
            moved_tokens += query.cost_tokens
    return moves


def _start_delays_s(c: ClusterLoad) -> list[float]:
    """Time until each queued query of c can start, and (last) until its queue is done."""
    ahead = c.running_tokens
    delays = []
    for w in c.waiting:
        delays.append(ahead / c.tokens_per_s if c.tokens_per_s > 0 else float("inf"))
        ahead += w.cost_tokens
    delays.append(ahead / c.tokens_per_s if c.tokens_per_s > 0 else float("inf"))
    return delays
