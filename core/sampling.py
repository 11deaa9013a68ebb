"""Sampling parameters of an OpenAI request, as every engine receives them.

The fields and defaults are vLLM's SamplingParams' (the ingress fills them from the
request body, app.sampling); the vLLM engine maps them one to one
(engines.vllm_sampling). The modelled engine makes placeholder tokens: it honours what
decides how many tokens it makes and where the text ends (`MODELLED`), and the ingress
refuses a request that sets any other field away from its default (`unmodelled`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the text (vLLM's StructuredOutputsParams): exactly one of json,
    regex, choice, grammar, json_object or structural_tag, and its whitespace options."""

    json: str | None = None  # a JSON schema, as JSON text
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # as JSON text
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # vLLM's extension: generate max_tokens tokens, past any end-of-sequence token (benchmarks
    # that replay a trace's output lengths need the engine to produce exactly that many).
    ignore_eos: bool = False
    min_tokens: int = 0  # stop strings and EOS count only after this many tokens
    include_stop_str_in_output: bool = False
    top_k: int = 0  # 0 (or -1): all tokens
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    logprobs: int | None = None  # candidates per generated token besides the one sampled; None: none
    prompt_logprobs: int | None = None  # the same for each prompt token
    structured: StructuredOutput | None = None


# What the modelled engine honours: temperature, top_p and seed pick among tokens, and its
# tokens are placeholders whatever they are; the rest decide the count and the text's end.
MODELLED = frozenset({"temperature", "top_p", "seed", "stop", "ignore_eos", "min_tokens",
                      "include_stop_str_in_output", "skip_special_tokens"})
_DEFAULT = {f.name: f.default for f in fields(Sampling)}


def unmodelled(sampling: Sampling) -> list[str]:
    """Fields set away from their default that only a real engine honours."""
    return [name for name, default in _DEFAULT.items()
            if name not in MODELLED and getattr(sampling, name) != default]
