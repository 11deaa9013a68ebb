"""What a replica deployment is for (Splitwise phases, Chiron kinds, DynamoLLM pools)."""

from __future__ import annotations

from enum import Enum


class ReplicaRole(str, Enum):
    PROMPT = "prompt"  # Splitwise: prefill only, hands KV to a token replica
    TOKEN = "token"  # Splitwise: decode only
    MIXED = "mixed"  # both phases (also Chiron's mixed interactive+batch replicas)
    CLASS_POOL = "class_pool"  # DynamoLLM: a pool serving a set of length classes
