"""OpenAI sampling fields -> vLLM SamplingParams (DELTA outputs: each chunk new tokens only)."""

from __future__ import annotations

from typing import Any

from core.request import Request


def sampling_params(request: Request) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    s = request.sampling
    return SamplingParams(
        temperature=s.temperature, top_p=s.top_p, stop=list(s.stop) or None, seed=s.seed,
        max_tokens=request.max_tokens, ignore_eos=s.ignore_eos, output_kind=RequestOutputKind.DELTA,
    )
