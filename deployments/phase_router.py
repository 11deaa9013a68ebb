"""A request router that sends each Splitwise phase to the replica the coordinator chose.

The coordinator (deployments.splitwise_coordinator) names a replica by its Serve
unique id in the request's metadata; this router ranks that replica first. If it is
gone (or full, where Serve moves on to the next rank) the request falls back to the
pool's pending-token ranking of TokenBalancedRouter, so it is served, not lost.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RunningReplica

from deployments.kv_router import routed_request
from deployments.token_router import TokenBalancedRouter

# Request.metadata key: the Serve unique id of the replica assigned to this phase.
ASSIGNED_REPLICA_KEY = "splitwise_replica"


def assigned_replica(pending: PendingRequest | None) -> str | None:
    return getattr(routed_request(pending), "metadata", {}).get(ASSIGNED_REPLICA_KEY)


def assigned_first(ranks: list[list[RunningReplica]], candidates: list[RunningReplica],
                   target: str | None) -> list[list[RunningReplica]]:
    """`ranks` with the assigned replica moved ahead of all others, if it is a candidate."""
    chosen = [r for r in candidates if target is not None and r.replica_id.unique_id == target]
    if not chosen:
        return ranks
    rest = [[r for r in rank if r is not chosen[0]] for rank in ranks]
    return [chosen, *(rank for rank in rest if rank)]


class AssignedReplicaRouter(TokenBalancedRouter):
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        return assigned_first(ranks, candidate_replicas, assigned_replica(pending_request))
