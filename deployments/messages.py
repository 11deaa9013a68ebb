"""What pool replicas send back over Ray handles: frozen dataclasses, so the ingress, the
phase split and stream resumption read typed fields instead of dicts with magic keys.

A replica answers every call with a `Reply`: a `ReplicaChunk` of tokens (the last one
carries `finish_reason` and the request's `RequestUsage`), or a `Refusal` when it did not
serve the request (`Squashed` after waiting past its deadline, `Shed` on overload). The
Splitwise prompt phase answers `Prefilled`. All are plain frozen dataclasses: they
pickle across Ray and cost no more to send than the dicts they replace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deployments.kv_handoff import KvHandle
from engines.protocol import GenerationChunk, RequestUsage, TokenLogprobs


@dataclass(frozen=True)
class SplitwiseReport:
    """Where each phase of a split request ran and how its KV came (the response's
    `wattwise.splitwise` block)."""

    prompt_replica: str
    prompt_role: str
    token_replica: str
    token_role: str
    kv_bytes: int = 0
    kv: str | None = None  # how the token replica got the KV; None without a token phase

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ReplicaChunk:
    """Tokens since the replica's last chunk; the last one has `finish_reason` and `usage`
    (engines.protocol.GenerationChunk's fields, and where a split request ran)."""

    text: str
    num_tokens: int
    finish_reason: str | None = None
    usage: RequestUsage | None = None
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    # Splitwise token phase, on its last chunk: the replica that decoded and how its KV came.
    replica: str | None = None
    kv: str | None = None
    # Set by the ingress's phase split on the last chunk of a split request.
    splitwise: SplitwiseReport | None = None

    @classmethod
    def of(cls, chunk: GenerationChunk) -> ReplicaChunk:
        """An engine's chunk as sent on."""
        return cls(chunk.text, chunk.num_tokens, chunk.finish_reason, chunk.usage, chunk.token_ids, chunk.logprobs,
                   chunk.stop_reason, chunk.prompt_logprobs)

    @classmethod
    def merged(cls, chunks: Sequence[GenerationChunk]) -> ReplicaChunk:
        """Several consecutive engine chunks as one (the last one's ending)."""
        last = chunks[-1]
        logprobs = [c.logprobs for c in chunks if c.logprobs is not None]
        return cls("".join(c.text for c in chunks), sum(c.num_tokens for c in chunks), last.finish_reason,
                   last.usage, tuple(i for c in chunks for i in c.token_ids),
                   tuple(p for lp in logprobs for p in lp) if logprobs else None, last.stop_reason,
                   next((c.prompt_logprobs for c in chunks if c.prompt_logprobs is not None), None))


@dataclass(frozen=True)
class Squashed:
    """The request waited `waited_s` without starting and was dropped (DynamoLLM §IV-D)."""

    waited_s: float


@dataclass(frozen=True)
class Shed:
    """Overload at arrival (queue cap, or a wait past the TTFT target): answered, not
    raised, so the ingress tells it from a replica failure and replies 503 + Retry-After."""

    reason: str
    retry_after_s: float


Refusal = Squashed | Shed
Reply = ReplicaChunk | Refusal


@dataclass(frozen=True)
class Prefilled:
    """The Splitwise prompt phase's answer: the first token (None with vLLM, or a refusal),
    the KV handle for the token replica, and the replica that ran the prompt."""

    first: ReplicaChunk | Refusal | None
    kv: KvHandle | None
    replica: str
