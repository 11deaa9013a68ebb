"""A Ray Serve request router that balances pending tokens across a pool's replicas.

Mico's dispatch in its online form (app.dispatch.rank_by_load): each request goes to the
replica with the least pending tokens (prompt + predicted output), as replicas report
them (`record_routing_stats`) or as this router has reserved them, whichever is more:
reserving inside choose_replicas keeps a burst between two stats reports from herding
onto one replica (see ../shared/notes/ray-serve-2.60.md).
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from app.dispatch import rank_by_load
from app.token_ledger import TokenLedger
from deployments.kv_router import routed_request

PENDING_TOKENS_STAT = "pending_tokens"


def request_cost_tokens(pending: PendingRequest | None) -> int:
    """prompt + predicted output of the core Request passed to generate/complete (0 if none)."""
    request = routed_request(pending)
    prompt: int = getattr(request, "prompt_tokens", 0)
    predicted: int | None = getattr(request, "predicted_output_tokens", None)
    output: int = predicted if predicted else getattr(request, "max_tokens", 0)
    return prompt + output


class TokenBalancedRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._index: dict[ReplicaID, int] = {}
        self._ledger = TokenLedger(0)

    def _slot(self, replica_id: ReplicaID) -> int:
        if replica_id not in self._index:
            self._index[replica_id] = len(self._ledger.load_tokens)
            self._ledger.load_tokens.append(0.0)
        return self._index[replica_id]

    def _load_tokens(self, replica: RunningReplica) -> float:
        reported = float(replica.routing_stats.get(PENDING_TOKENS_STAT, 0.0))
        return max(reported, self._ledger.load_tokens[self._slot(replica.replica_id)])

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        loads = [self._load_tokens(r) for r in candidate_replicas]
        order = rank_by_load(loads, [1.0] * len(loads), request_cost_tokens(pending_request))
        if pending_request is not None:
            self._reserve(pending_request, candidate_replicas[order[0]].replica_id)
        return [[candidate_replicas[k]] for k in order]

    def _reserve(self, pending: PendingRequest, replica_id: ReplicaID) -> None:
        """Hold the request's tokens on a replica at once, so concurrent choices see them."""
        rid = pending.metadata.internal_request_id
        if self._ledger.holds(rid):
            self._ledger.move(rid, self._slot(replica_id))
        else:
            self._ledger.add(self._slot(replica_id), rid, request_cost_tokens(pending))

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        """Serve may have taken a lower rank (a full replica): move the reservation there."""
        self._reserve(pending_request, replica_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._ledger.holds(internal_request_id):
            self._ledger.finish(internal_request_id)
