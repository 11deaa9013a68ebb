"""What a replica deployment is for: one enum per paper's notion, used everywhere a role is
named (config, policies, simulator, Serve), so a role is never a bare string."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Splitwise's phase pools."""

    PROMPT = "prompt"  # prefill only, hands KV to a token replica
    TOKEN = "token"  # decode only
    MIXED = "mixed"  # both phases


class ReplicaKind(StrEnum):
    """Chiron's replica types."""

    INTERACTIVE = "interactive"  # interactive requests only
    MIXED = "mixed"  # interactive first, batch requests fill the rest
    BATCH = "batch"  # batch requests only, scaled from the batch queue's deadlines


# The global batch queue (Chiron §5.3: the Batch API's durable queue in Serve, the simulator's
# backlog) reports its request groups as a deployment of this name in both runtimes.
BATCH_QUEUE_DEPLOYMENT = "batch-queue"
