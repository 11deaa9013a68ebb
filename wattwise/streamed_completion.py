"""One streamed completion over the OpenAI API, timed where a user sees it: at the client.

The demo and the live-vs-simulated bench replay traces through the served app with it; the
times are the client's own (time.monotonic), the report and usage are the server's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import openai
import pydantic


def extra_fields(body: pydantic.BaseModel) -> dict[str, Any]:
    """The fields of an OpenAI object the API does not define (our server's additions)."""
    return body.model_extra or {}


@dataclass
class StreamedCompletion:
    """Client-side times (time.monotonic) of one streamed completion and what the server
    reported about it."""

    sent_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    energy_j: float = 0.0
    report: dict[str, Any] | None = None  # the app's `wattwise` object (SLO, pool, class)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.last_token_s is None else self.last_token_s - self.sent_s

    @property
    def mean_tbt_s(self) -> float | None:
        """The mean gap between tokens over the whole answer (chunks may hold several); 0
        for a one-token answer, as the simulator records it (sim.records)."""
        if self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / max(self.completion_tokens - 1, 1)


async def stream_completion(client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int,
                            **fields: Any) -> StreamedCompletion:
    """Send one streamed /v1/completions request; `fields` go into its body as they are
    (e.g. temperature, or vLLM's ignore_eos). API errors propagate."""
    result = StreamedCompletion(sent_s=time.monotonic())
    chunks = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        extra_body=fields or None,
    )
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].text:
            result.last_token_s = time.monotonic()
            if result.first_token_s is None:
                result.first_token_s = result.last_token_s
        if extra_fields(chunk).get("wattwise"):
            result.report = extra_fields(chunk)["wattwise"]
        if chunk.usage:
            result.energy_j = extra_fields(chunk.usage)["energy_j"]
            result.prompt_tokens = chunk.usage.prompt_tokens
            result.completion_tokens = chunk.usage.completion_tokens
    return result
