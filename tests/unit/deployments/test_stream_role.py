"""Streamed chat completions name the role once, in the first chunk, as OpenAI's and vLLM's
servers do: a client that concatenates every delta field by field (some SDK helpers, some
benchmark clients) would otherwise build the role "assistantassistant...". Text completion
chunks carry no role at all. Checked on the ingress's SSE generator itself with stub
replica chunks, no Ray (tests/ray/test_serve.py checks the same over HTTP)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from app.openai_api import chat_body, completion_body
from deployments.ingress import Ingress
from deployments.messages import ReplicaChunk


class _Stream:
    """The replica stream after its first chunk (what ResumableStream yields)."""

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


def _events(render: Any, texts: list[str], include_usage: bool = True) -> list[dict[str, Any]]:
    chunks = [ReplicaChunk(t, 1) for t in texts[:-1]] + [ReplicaChunk(texts[-1], 1, finish_reason="length")]
    ingress = SimpleNamespace(
        _report=lambda *a, **k: None, _learn=lambda *a: None,
        metrics=SimpleNamespace(outcome=lambda *a: None),
    )

    async def collect() -> list[str]:
        sse = Ingress._sse(ingress, _Stream(chunks[1:]), chunks[0], "cmpl-1", "m", render, None,  # type: ignore[arg-type]
                           "/v1/chat/completions", include_usage)
        return [line async for line in sse]

    lines = asyncio.run(collect())
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_only_the_first_chat_delta_carries_the_role() -> None:
    events = _events(chat_body, ["Hello", " there", " world"])
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": "Hello"}
    assert deltas[1:] == [{"content": " there"}, {"content": " world"}]
    assert events[-1]["choices"] == []  # the usage chunk (stream_options.include_usage)
    assert all(e["object"] == "chat.completion.chunk" for e in events)


def test_a_one_chunk_stream_still_names_the_role() -> None:
    events = _events(chat_body, ["Hi"], include_usage=False)
    assert [e["choices"][0]["delta"] for e in events] == [{"role": "assistant", "content": "Hi"}]
    assert events[0]["choices"][0]["finish_reason"] == "length"


def test_completion_chunks_carry_no_role() -> None:
    events = _events(completion_body, ["a", "b"])
    assert [e["choices"][0]["text"] for e in events if e["choices"]] == ["a", "b"]
    assert all("delta" not in c and "role" not in c for e in events for c in e["choices"])


def test_chat_body_role_only_when_first() -> None:
    first = chat_body("r", "m", "x", None, None, chunk=True, first_chunk=True)
    later = chat_body("r", "m", "y", None, None, chunk=True)
    whole = chat_body("r", "m", "z", "stop", None, chunk=False)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "x"}
    assert later["choices"][0]["delta"] == {"content": "y"}
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "z"}
