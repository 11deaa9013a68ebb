"""One inference request as every policy sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.sampling import Sampling
from core.slo import SLO


@dataclass
class Request:
    """A request after classification; lengths in tokens, times in seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    slo: SLO
    service_class: str = "interactive"
    length_class: str = "MM"
    predicted_output_tokens: int | None = None
    # Output length the engine will actually produce (modelled engines and traces know it;
    # a real engine stops at EOS). None means: generate up to max_tokens.
    target_output_tokens: int | None = None
    tenant: str = "default"
    metadata: dict[str, str] = field(default_factory=dict)
    # What a real engine needs to generate (the modelled engine only counts tokens).
    prompt_text: str = ""
    sampling: Sampling = Sampling()
    # Whether the engine adds the tokenizer's special tokens (BOS) to prompt_text: a
    # completion's prompt yes, a chat template's rendering no (it has its own), as vLLM's server.
    add_special_tokens: bool = True
    # A LoRA adapter of the engine's (by its served name) to generate with; None: the base model.
    adapter: str | None = None
    # The prompt's prefix blocks, chained hashes (core.prefix_cache): what prefix caches hold
    # of it and prefix-aware routers rank replicas by. Empty: not hashed (no prefix routing).
    prefix_hashes: tuple[int, ...] = ()
    # Overflow between pools (app.pool_overflow): a replica with more prompt tokens than this
    # still to prefill refuses the request at arrival, and the router tries its next pool.
    # None: the request queues wherever it is sent.
    refuse_above_pending_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    def overflows(self, pending_prompt_tokens: int) -> bool:
        """Whether a replica with `pending_prompt_tokens` still to prefill refuses it."""
        limit = self.refuse_above_pending_tokens
        return limit is not None and pending_prompt_tokens > limit

    @property
    def ttft_due_s(self) -> float:
        """When its first token is due: what deadline-ordered prefill orders by."""
        return self.arrival_s + self.slo.ttft_s

    @property
    def output_tokens_to_generate(self) -> int:
        if self.target_output_tokens is None:
            return self.max_tokens
        return max(1, min(self.target_output_tokens, self.max_tokens))

    @property
    def deadline_s(self) -> float:
        """Absolute E2E deadline, sized by the predicted (else the maximum) output."""
        out = self.predicted_output_tokens or self.max_tokens
        return self.arrival_s + self.slo.e2e_for(out)
