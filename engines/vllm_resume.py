"""One client request across the vLLM requests it takes when Chiron preempts it.

A preempted batch request is aborted in vLLM and later resumed as a new vLLM request
whose prompt is the original prompt's token ids plus the ids generated so far (never
re-tokenised text, so greedy output is exactly that of an uninterrupted run) and whose
max_tokens is what is left. This records what the client has been sent and builds each
segment's prompt and sampling parameters; timings span all segments (TTFT from the
first token ever, the largest gap between tokens includes the wait while preempted).

Sampling with temperature > 0 stays a valid sample but not the draw an uninterrupted
run would make (each segment restarts vLLM's per-request generator from the seed), and
a stop string that spans the preemption point is not detected.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from core.request import Request
from engines.vllm_block_connector import EXPORT_KV, KEEP_KV_ON_ABORT
from engines.vllm_sampling import sampling_params


@dataclass
class Continuation:
    request: Request
    keep_kv_on_abort: bool = False  # preemptible: ask the KV connector to keep its KV
    export_kv: bool = False  # a Splitwise prompt phase: the KV connector stores its KV
    prompt_ids: list[int] | None = None  # as vLLM tokenised the prompt text (or given to it)
    generated_ids: list[int] = field(default_factory=list)
    first_s: float | None = None
    last_s: float | None = None
    max_tbt_s: float = 0.0
    preemptions: int = 0

    @property
    def generated(self) -> int:
        return len(self.generated_ids)

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - self.generated

    @property
    def vllm_request_id(self) -> str:
        """A fresh vLLM id per segment: vLLM may still hold the aborted one's KV blocks."""
        rid = self.request.request_id
        return rid if self.preemptions == 0 else f"{rid}-resume{self.preemptions}"

    def prompt(self) -> Any:
        if self.prompt_ids is None:  # nothing seen yet: the text as the client sent it
            return self.request.prompt_text
        return {"prompt_token_ids": self.prompt_ids + self.generated_ids}

    def sampling(self) -> Any:
        """vLLM SamplingParams of this segment: the request's, for the tokens left."""
        request = self.request
        if self.prompt_ids is not None:  # a resumed segment: its prompt's logprobs were sent
            sampling = request.sampling
            request = replace(request, sampling=replace(sampling, prompt_logprobs=None,
                                                        min_tokens=max(0, sampling.min_tokens - self.generated)))
        params = sampling_params(replace(request, max_tokens=self.remaining))
        flags = {k: True for k, on in ((KEEP_KV_ON_ABORT, self.keep_kv_on_abort), (EXPORT_KV, self.export_kv)) if on}
        if flags:
            params.extra_args = {**(params.extra_args or {}), **flags}
        return params

    def add(self, output: Any, now_s: float) -> int:
        """Record one DELTA RequestOutput of the current segment; returns its new tokens."""
        if self.prompt_ids is None and output.prompt_token_ids:
            self.prompt_ids = list(output.prompt_token_ids)
        new = list(output.outputs[0].token_ids)
        if new:
            if self.first_s is None:
                self.first_s = now_s
            elif self.last_s is not None:
                self.max_tbt_s = max(self.max_tbt_s, now_s - self.last_s)
            self.last_s = now_s
            self.generated_ids += new
        return len(new)
