"""The pools' default Ray Serve request router: of the replicas whose KV cache has room for
the prompt, the one with the least prompt work ahead, then the shortest queue
(core.replica_choice, the rank the simulator's dispatch uses).

Replicas report their occupancy every `request_routing_stats_period_s`
(LLMReplica.record_routing_stats), so a report is up to that old. This router adds what
it sent each replica since: prompts sent within the last period count as prompt work and
KV not yet reported, and the requests it has in flight there count if more than the
report's. A burst between two reports would otherwise all join the replica that looked
emptiest (see ../shared/notes/ray-serve-2.60.md). One router per process holding a handle
(each ingress replica): each counts what it sent.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from core.kv_budget import KV_BUDGET
from core.replica_choice import PrefixAffinity, ReplicaOccupancy, rank_replicas

REQUESTS_STAT, PENDING_PROMPT_STAT = "requests", "pending_prompt_tokens"
KV_USED_STAT, KV_TOTAL_STAT = "kv_tokens_used", "kv_tokens_total"
PREFIX_BLOCKS_STAT = "prefix_blocks"  # the prefix blocks a replica holds, most recent first
# A report's cap: 8,192 blocks of 512 tokens are 4M tokens of KV (an 8-GPU replica's), ~70 KB a
# second per replica to every router.
MAX_REPORTED_BLOCKS = 8192
STATS_PERIOD_S = 1.0  # how often replicas report (request_routing_stats_period_s, set by deployments.builder)


def occupancy_stats(occupancy: ReplicaOccupancy) -> dict[str, float]:
    """A replica's occupancy as Serve's routing stats carry it (flat floats)."""
    return {REQUESTS_STAT: float(occupancy.requests), PENDING_PROMPT_STAT: float(occupancy.pending_prompt_tokens),
            KV_USED_STAT: float(occupancy.kv_tokens_used), KV_TOTAL_STAT: float(occupancy.kv_tokens_total)}


def routed_request(pending: PendingRequest | None) -> Any:
    """The core Request passed to generate/complete (None if none): what every pool router reads."""
    return pending.args[0] if pending is not None and pending.args else None


def prompt_tokens(pending: PendingRequest | None) -> int:
    """The prompt tokens of the routed request (0 if none)."""
    return int(getattr(routed_request(pending), "prompt_tokens", 0))


class KvAwareRouter(RequestRouter):
    def initialize_state(self, kv_budget: float = KV_BUDGET, stats_period_s: float = STATS_PERIOD_S,
                         now_s: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        self._kv_budget, self._stats_period_s, self._now_s = kv_budget, stats_period_s, now_s
        self._in_flight: dict[str, ReplicaID] = {}  # internal request id -> the replica it was sent to
        self._requests: Counter[ReplicaID] = Counter()
        self._recent: dict[ReplicaID, deque[tuple[float, int]]] = {}  # (sent at, prompt tokens), oldest first

    def _unreported_prompt_tokens(self, replica_id: ReplicaID) -> int:
        """Prompt tokens sent to the replica within the last stats period: maybe not in its report."""
        recent = self._recent.get(replica_id)
        if recent is None:
            return 0
        since_s = self._now_s() - self._stats_period_s
        while recent and recent[0][0] < since_s:
            recent.popleft()
        return sum(tokens for _, tokens in recent)

    def _occupancy(self, replica: RunningReplica, pending: PendingRequest | None) -> ReplicaOccupancy:
        stats, rid = replica.routing_stats, replica.replica_id
        unreported = self._unreported_prompt_tokens(rid)
        return ReplicaOccupancy(max(int(stats.get(REQUESTS_STAT, 0)), self._requests[rid]),
                                stats.get(PENDING_PROMPT_STAT, 0.0) + unreported,
                                stats.get(KV_USED_STAT, 0.0) + unreported,
                                stats.get(KV_TOTAL_STAT, float("inf")))  # none reported yet: room

    def _affinity(self) -> PrefixAffinity | None:
        return None

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        order = rank_replicas([self._occupancy(r, pending_request) for r in candidate_replicas],
                              prompt_tokens(pending_request), self._kv_budget, self._affinity())
        if pending_request is not None:
            self._count(pending_request, candidate_replicas[order[0]].replica_id)
        return [[candidate_replicas[k]] for k in order]

    def _count(self, pending: PendingRequest, replica_id: ReplicaID) -> None:
        """Count the request on `replica_id` at once, so concurrent choices see it. Counted
        again on another replica (Serve took a lower rank), its prompt counts on both for a
        period: the cautious side."""
        request_id = pending.metadata.internal_request_id
        self._uncount(request_id)
        self._in_flight[request_id] = replica_id
        self._requests[replica_id] += 1
        self._recent.setdefault(replica_id, deque()).append((self._now_s(), prompt_tokens(pending)))

    def _uncount(self, internal_request_id: str) -> None:
        replica_id = self._in_flight.pop(internal_request_id, None)
        if replica_id is not None:
            self._requests[replica_id] -= 1

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        """Serve may have taken a lower rank (a full replica): count the request there."""
        if self._in_flight.get(pending_request.metadata.internal_request_id) != replica_id:
            self._count(pending_request, replica_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._uncount(internal_request_id)


class PrefixAwareRouter(KvAwareRouter):
    """KvAwareRouter's rank after the replicas holding most of the prompt's prefix blocks
    (Request.prefix_hashes), within the load bound (core.replica_choice.PrefixAffinity).

    What a replica holds is what it reported (its prefix cache: the modelled engine's LRU, or
    vLLM's from its KV cache events), plus the blocks of the prompts this router sent it since
    its last report: a prompt is cached once prefilled, and the next turn of a conversation
    often comes before the next report."""

    def initialize_state(self, kv_budget: float = KV_BUDGET, stats_period_s: float = STATS_PERIOD_S,
                         now_s: Callable[[], float] = time.monotonic, block_tokens: int = 512,
                         imbalance_requests: float = PrefixAffinity().imbalance_requests,
                         min_match: float = PrefixAffinity().min_match, **kwargs: Any) -> None:
        super().initialize_state(kv_budget, stats_period_s, now_s, **kwargs)
        self._block_tokens = block_tokens
        self._prefix_affinity = PrefixAffinity(imbalance_requests=imbalance_requests, min_match=min_match)
        self._reported: dict[ReplicaID, tuple[Any, frozenset[int]]] = {}  # its last report, as a set
        self._sent: dict[ReplicaID, deque[tuple[float, tuple[int, ...]]]] = {}  # (sent at, prefix), oldest first

    def _affinity(self) -> PrefixAffinity | None:
        return self._prefix_affinity

    def _held(self, replica: RunningReplica) -> frozenset[int]:
        """The blocks its last report named (converted once per report)."""
        report = replica.routing_stats.get(PREFIX_BLOCKS_STAT) or ()
        known = self._reported.get(replica.replica_id)
        if known is None or known[0] is not report:
            known = (report, frozenset(report))
            self._reported[replica.replica_id] = known
        return known[1]

    def _occupancy(self, replica: RunningReplica, pending: PendingRequest | None) -> ReplicaOccupancy:
        occupancy = super()._occupancy(replica, pending)
        prefix = getattr(routed_request(pending), "prefix_hashes", ())
        if not prefix:
            return occupancy
        held, sent = self._held(replica), self._sent_since_report(replica.replica_id)
        blocks = 0
        for block in prefix:
            if block not in held and not any(block in p for p in sent):
                break
            blocks += 1
        return dataclasses.replace(occupancy, cached_prompt_tokens=blocks * self._block_tokens)

    def _sent_since_report(self, replica_id: ReplicaID) -> list[tuple[int, ...]]:
        sent = self._sent.get(replica_id)
        if sent is None:
            return []
        since_s = self._now_s() - self._stats_period_s
        while sent and sent[0][0] < since_s:
            sent.popleft()
        return [prefix for _, prefix in sent]

    def _count(self, pending: PendingRequest, replica_id: ReplicaID) -> None:
        super()._count(pending, replica_id)
        prefix = getattr(routed_request(pending), "prefix_hashes", ())
        if prefix:
            self._sent.setdefault(replica_id, deque()).append((self._now_s(), prefix))
