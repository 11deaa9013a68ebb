"""Sampling parameters of an OpenAI request, as every engine receives them.

The sim engine ignores them (its tokens are placeholders); the vLLM engine maps them
onto vLLM's SamplingParams. Defaults are OpenAI's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # vLLM's extension: generate max_tokens tokens, past any end-of-sequence token (benchmarks
    # that replay a trace's output lengths need the engine to produce exactly that many).
    ignore_eos: bool = False
