"""A trace window sized for a small engine, as requests with real prompt text.

A 2-core CPU serving SmolLM2 carries a fraction of a GPU's load: the window keeps the
trace's arrival pattern with its timeline stretched to a lower rate, and clips lengths to
what the model's context and a modest max_tokens allow. Each prompt is text the served
model's tokenizer counts, so the simulator is given the token count the engine sees.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engines.latency_profiling import prompt_of_tokens
from sim.workload import Workload, fit_context, load_trace, scale_time, window


@dataclass(frozen=True)
class WindowSpec:
    """Which part of which trace is replayed, and how it is scaled to the engine."""

    trace: str = "conv"
    start_s: float = 0.0
    duration_s: float = 30.0
    rate_per_s: float = 0.5  # the stretched window's mean arrival rate
    max_prompt_tokens: int = 1024
    max_tokens: int = 128
    context_tokens: int = 2048  # the served model's max_model_len

    def describe(self, requests: int, span_s: float) -> str:
        return (f"{self.trace} trace {self.start_s:g}-{self.start_s + self.duration_s:g} s, {requests} requests "
                f"stretched to {self.rate_per_s:g} req/s over {span_s:.0f} s, prompts clipped to "
                f"{self.max_prompt_tokens} tokens, outputs to {self.max_tokens}")


@dataclass(frozen=True)
class ReplayRequest:
    """One request of the replay: when it is sent, its text and the tokens it costs."""

    arrival_s: float
    prompt: str
    prompt_tokens: int  # as the served model's tokenizer counts `prompt`
    output_tokens: int  # max_tokens, generated past EOS


def scaled_window(trace: Workload, spec: WindowSpec) -> Workload:
    """The spec's window of `trace` at its rate, lengths clipped (a window of n requests
    over duration_s is stretched by n / (duration_s x rate))."""
    w = fit_context(window(trace, spec.start_s, spec.duration_s), spec.context_tokens)
    if not len(w):
        raise ValueError(f"no requests in {spec.trace} between {spec.start_s} and {spec.start_s + spec.duration_s} s")
    w = scale_time(w, len(w) / (spec.duration_s * spec.rate_per_s))
    return Workload(w.arrival_s, np.minimum(w.prompt_tokens, spec.max_prompt_tokens),
                    np.minimum(w.output_tokens, spec.max_tokens), w.interactive)


def replay_requests(w: Workload, count_tokens: Callable[[str], int], tag: str | None = None) -> list[ReplayRequest]:
    """A prompt for every request of `w` of at most its prompt tokens under `count_tokens`,
    counted again. Each starts with `tag` (default: random) and its index, so no prompt
    shares a prefix-cache block with another (the simulator models no cache hits)."""
    tag = uuid.uuid4().hex[:8] if tag is None else tag
    out = []
    for i, (arrival, prompt_tokens, output_tokens) in enumerate(
            zip(w.arrival_s, w.prompt_tokens, w.output_tokens, strict=True)):
        prompt = prompt_of_tokens(count_tokens, int(prompt_tokens), f"{tag}-{i}: ")
        out.append(ReplayRequest(float(arrival), prompt, count_tokens(prompt), int(output_tokens)))
    return out


def load_window(spec: WindowSpec) -> Workload:
    return scaled_window(load_trace(spec.trace), spec)
