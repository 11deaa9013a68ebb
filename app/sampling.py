"""A validated request body (app.openai_api) -> core.sampling.Sampling, as vLLM's server
maps it onto SamplingParams (its `to_sampling_params`): absent fields take vLLM's
defaults, `echo` asks for the prompt's logprobs, response_format becomes a structured
output. On an app whose engine is modelled, a field only a real engine honours is a 400
naming it (core.sampling.unmodelled): never dropped in silence.
"""

from __future__ import annotations

import json
from typing import Any

from app.openai_api import APIError, ChatCompletionRequest, ResponseFormat, StructuredOutputs
from core.sampling import Sampling, StructuredOutput, unmodelled


def structured_of(response_format: ResponseFormat | None,
                  structured: StructuredOutputs | None) -> StructuredOutput | None:
    """vLLM's structured_outputs_from_response_format: response_format wins, else the extension's."""
    if response_format is not None and response_format.type == "json_object":
        return StructuredOutput(json_object=True)
    if response_format is not None and response_format.type == "json_schema":
        assert response_format.json_schema is not None  # the schema's own rule
        return StructuredOutput(json=json.dumps(response_format.json_schema.json_schema or {}))
    if structured is None:
        return None
    spec = structured.json_
    return StructuredOutput(
        json=None if spec is None else spec if isinstance(spec, str) else json.dumps(spec),
        regex=structured.regex, choice=None if structured.choice is None else tuple(structured.choice),
        grammar=structured.grammar, json_object=structured.json_object,
        disable_any_whitespace=structured.disable_any_whitespace,
        disable_additional_properties=structured.disable_additional_properties,
        whitespace_pattern=structured.whitespace_pattern)


def _logprobs(body: Any) -> int | None:
    """Candidates per generated token: a completion's `logprobs`, a chat's `top_logprobs`
    when `logprobs` is true."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def _prompt_logprobs(body: Any, logprobs: int | None) -> int | None:
    """A completion's echo with logprobs asks for the prompt's too (vLLM's; a chat's echo
    there also computes them, which this app does not: it answers with none)."""
    if body.prompt_logprobs is not None or isinstance(body, ChatCompletionRequest) or not body.echo:
        return body.prompt_logprobs
    return logprobs


def sampling_of(body: Any, modelled: bool = False, structured: StructuredOutput | None = None) -> Sampling:
    """The engine's sampling for `body`; `structured` (a tool choice's constraint) replaces
    the body's own. `modelled`: the app's engine makes placeholder tokens."""
    stop = body.stop
    logprobs = _logprobs(body)
    sampling = Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed, stop=(stop,) if isinstance(stop, str) else tuple(stop or ()), ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens, include_stop_str_in_output=body.include_stop_str_in_output,
        top_k=0 if body.top_k in (None, -1) else body.top_k, min_p=body.min_p or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0, presence_penalty=body.presence_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=tuple((int(k), v) for k, v in (body.logit_bias or {}).items()),
        allowed_token_ids=None if body.allowed_token_ids is None else tuple(body.allowed_token_ids),
        bad_words=tuple(body.bad_words or ()), stop_token_ids=tuple(body.stop_token_ids or ()),
        skip_special_tokens=body.skip_special_tokens, logprobs=logprobs,
        prompt_logprobs=_prompt_logprobs(body, logprobs),
        structured=structured or structured_of(body.response_format, body.structured_outputs),
    )
    if modelled and (fields := unmodelled(sampling)):
        name = _request_field(body, fields[0])
        raise APIError(400, f"'{name}' needs a real engine: this app's modelled engine makes placeholder tokens "
                       "and honours max_tokens, stop, n and echo (docs/operations.md).", param=name,
                       code="unsupported_parameter")
    return sampling


def _request_field(body: Any, field: str) -> str:
    """The request field that set a sampling field (its own name, mostly)."""
    if field == "structured":
        if getattr(body, "tools", None):
            return "tools"
        return "response_format" if body.response_format is not None else "structured_outputs"
    if field == "prompt_logprobs" and body.prompt_logprobs is None:
        return "echo"  # with logprobs: the prompt's logprobs
    return field
