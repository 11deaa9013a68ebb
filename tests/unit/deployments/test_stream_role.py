"""Streamed chat completions name the role once per choice, in a role-only first event, as
vLLM's server does: a client that concatenates every delta field by field (some SDK
helpers, some benchmark clients) would otherwise build the role "assistantassistant...".
Text completion chunks carry no role at all. Checked on the ingress's SSE generator
itself with stub replica chunks, no Ray (tests/ray/test_serve.py checks the same over HTTP)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from app.openai_api import ChatCompletionRequest, CompletionRequest
from app.openai_responses import ChatRenderer, CompletionRenderer
from deployments.ingress import Ingress
from deployments.messages import ReplicaChunk
from engines.protocol import RequestUsage

USAGE = RequestUsage(prompt_tokens=3, completion_tokens=1, energy_j=1.0, ttft_s=0.1, e2e_s=0.2, max_tbt_s=0.0,
                     preemptions=0)


class _Stream:
    """A replica stream (what ResumableStream yields)."""

    pool = "pool-short"

    def __init__(self, chunks: list[ReplicaChunk]) -> None:
        self._chunks = iter(chunks)
        self.progress = SimpleNamespace(first_token_s=None)

    async def __anext__(self) -> ReplicaChunk:
        return next(self._chunks)

    def resumption(self) -> Any:
        return None

    def cancel(self) -> None:
        pass


def _chunks(texts: list[str]) -> list[ReplicaChunk]:
    return [ReplicaChunk(t, 1) for t in texts[:-1]] + [ReplicaChunk(texts[-1], 1, finish_reason="length", usage=USAGE)]


def _events(renderer: Any, choices: list[list[str]], include_usage: bool = True) -> list[dict[str, Any]]:
    streams = [_Stream(_chunks(texts)[1:]) for texts in choices]
    firsts = [_chunks(texts)[0] for texts in choices]
    ingress = SimpleNamespace(
        _report=lambda *a, **k: None, _learn=lambda *a: None,
        metrics=SimpleNamespace(outcome=lambda *a: None),
    )

    async def collect() -> list[str]:
        sse = Ingress._sse(ingress, streams, firsts, "cmpl-1", "m", renderer, None,  # type: ignore[arg-type]
                           "/v1/chat/completions", include_usage)
        return [line async for line in sse]

    lines = asyncio.run(collect())
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def _chat(**extra: Any) -> ChatRenderer:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "stream": True, **extra})
    return ChatRenderer(body, lambda i: None)


def test_each_choice_names_its_role_once_in_a_role_only_first_event() -> None:
    events = _events(_chat(n=2), [["Hello", " there"], ["Hi", " you", " all"]])
    by_choice: dict[int, list[dict[str, Any]]] = {}
    for e in events[:-1]:
        by_choice.setdefault(e["choices"][0]["index"], []).append(e["choices"][0]["delta"])
    assert sorted(by_choice) == [0, 1]
    for deltas in by_choice.values():
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert all("role" not in d for d in deltas[1:])
    assert "".join(d.get("content", "") for d in by_choice[1]) == "Hi you all"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2  # both choices


def test_text_completion_chunks_have_no_role_and_the_last_says_why_it_ended() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "stream": True})
    events = _events(CompletionRenderer(body, "p"), [["a", "b"]], include_usage=False)
    assert [e["choices"][0]["text"] for e in events] == ["a", "b"]
    assert all("role" not in e["choices"][0] for e in events)
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, "length"]
