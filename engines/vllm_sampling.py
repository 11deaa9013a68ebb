"""core.sampling.Sampling -> vLLM's SamplingParams, field by field (as vLLM's server's
`to_sampling_params` fills it), and vLLM's logprob dicts -> our typed TokenLogprobs.
DELTA outputs: each chunk carries only its new tokens."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from core.request import Request
from core.sampling import StructuredOutput
from engines.protocol import Candidate, TokenLogprobs


def _structured(structured: StructuredOutput | None) -> Any:
    if structured is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    spec = dataclasses.asdict(structured)
    if spec["json"] is not None:
        spec["json"] = json.loads(spec["json"])
    if spec["choice"] is not None:
        spec["choice"] = list(spec["choice"])
    return StructuredOutputsParams(**spec)


def sampling_params(request: Request) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    s = request.sampling
    return SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p, seed=s.seed,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty, stop=list(s.stop) or None,
        stop_token_ids=list(s.stop_token_ids) or None, include_stop_str_in_output=s.include_stop_str_in_output,
        ignore_eos=s.ignore_eos, max_tokens=request.max_tokens, min_tokens=s.min_tokens,
        logprobs=s.logprobs, prompt_logprobs=s.prompt_logprobs, skip_special_tokens=s.skip_special_tokens,
        logit_bias=dict(s.logit_bias) or None,
        allowed_token_ids=None if s.allowed_token_ids is None else list(s.allowed_token_ids),
        bad_words=list(s.bad_words) or None, structured_outputs=_structured(s.structured),
        output_kind=RequestOutputKind.DELTA,
    )


Decode = Callable[[int], str]


def token_logprobs(token_ids: Sequence[int], positions: Sequence[dict[int, Any] | None],
                   decode: Decode) -> tuple[TokenLogprobs, ...]:
    """vLLM's per-position {token id: Logprob} (None where nothing precedes a prompt's first
    token), with the token there, in vLLM's order (its chosen token first)."""
    out = []
    for token_id, position in zip(token_ids, positions, strict=True):
        if position is None:
            out.append(TokenLogprobs(token_id, decode(token_id), None))
            continue
        candidates = tuple(Candidate(tid, lp.decoded_token if lp.decoded_token is not None else decode(tid),
                                     max(lp.logprob, -9999.0), lp.rank) for tid, lp in position.items())
        chosen = next(c for c in candidates if c.token_id == token_id)
        out.append(TokenLogprobs(token_id, chosen.token, chosen.logprob, candidates))
    return tuple(out)
