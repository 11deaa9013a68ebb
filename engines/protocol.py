"""The interface every engine (sim, vLLM) offers to a replica deployment."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from core.request import Request
from core.stats import ReplicaStats

# Request metadata: the continuation of a request another replica started (deployments.
# resume) begins at this output token, so an engine's deterministic text (the modelled engine's)
# goes on where it stopped.
RESUME_OFFSET_KEY = "resume_offset_tokens"

class TensorParallelChangeUnsupported(RuntimeError):
    """The engine cannot re-shard in place (vLLM): its pool changes TP by shadow
    deployments (autoscaling.shadow_rollout) or not at all."""


class RequestSquashed(Exception):
    """The replica dropped a request that waited too long to start (DynamoLLM §IV-D);
    the client should retry, ideally elsewhere."""

    def __init__(self, request_id: str, waited_s: float) -> None:
        super().__init__(f"request {request_id} waited {waited_s:.1f} s without starting")
        self.waited_s = waited_s


@dataclass(frozen=True)
class RequestUsage:
    """Final accounting of one request, sent with its last chunk."""

    prompt_tokens: int
    completion_tokens: int
    energy_j: float
    ttft_s: float
    e2e_s: float
    max_tbt_s: float
    preemptions: int


@dataclass(frozen=True)
class Candidate:
    """One token an engine weighed at a position, with its log-probability."""

    token_id: int
    token: str  # decoded
    logprob: float
    rank: int | None = None  # 1: the likeliest


@dataclass(frozen=True)
class TokenLogprobs:
    """One position of the text: the token there and the candidates asked for, in the
    engine's order (vLLM's: the chosen token first, then the likeliest). `logprob` is None
    for a prompt's first token (nothing precedes it)."""

    token_id: int
    token: str
    logprob: float | None
    candidates: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens produced since the last chunk; `usage` and `finish_reason` on the last.
    `token_ids` and `logprobs` (when asked for) cover this chunk's tokens; the first
    chunk carries the prompt's logprobs when asked for; `stop_reason` is the stop string
    or token id that ended the text (vLLM's), on the last."""

    text: str
    num_tokens: int
    finish_reason: str | None = None
    usage: RequestUsage | None = None
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None


class EngineSettings(Protocol):
    """What a replica reads of its engine's config (ModelledEngineConfig, VllmEngineConfig)."""

    @property
    def model(self) -> str: ...

    @property
    def hardware(self) -> str:
        """The GPU model (energy.hardware.GPUS key), for the node's GPU-control actor."""
        ...

    @property
    def tensor_parallel(self) -> int: ...


class Engine(Protocol):
    # Real GPUs the engine runs on (NVML indices on its node), whose clocks the replica
    # sets through the node's GPU-control actor; none for the simulated engine.
    gpu_ids: list[int]

    @property
    def config(self) -> EngineSettings: ...

    def count_tokens(self, text: str) -> int: ...

    def generate(self, request: Request) -> AsyncGenerator[GenerationChunk, None]:
        """Stream a request's output; closing the iterator aborts the request."""
        ...

    def stats(self) -> ReplicaStats: ...

    def prefix_blocks(self) -> list[int]:
        """The prompt prefix blocks (core.prefix_cache hashes) it holds, the most recently used
        first: what prefix-aware routers rank it by. Empty without the app's prefix_cache."""
        ...

    def set_batch_limit(self, limit: int) -> None: ...

    def min_tbt_slo_s(self) -> float | None:
        """The tightest TBT target among the requests the engine holds (None: none held);
        Chiron's local autoscaler keeps the batch within it."""
        ...

    def set_clock(self, clock_mhz: float) -> None: ...

    def set_clock_band(self, low_mhz: float, high_mhz: float) -> None:
        """The planner's bounds for this pool's clock: an engine with a per-step clock
        hook searches inside them, one without runs at the floor."""
        ...

    def clock_applied(self, clock_mhz: float | None) -> None:
        """The clock its GPUs run at, as the replica read it back from the node's GPU-control
        actor (None: unknown); a clock rule plans the steps until a new choice lands with it."""
        ...

    def set_tensor_parallel(self, tp: int) -> None: ...

    async def shutdown(self) -> None: ...
