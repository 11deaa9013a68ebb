"""Response bodies of /v1/completions and /v1/chat/completions, field for field as vLLM's
OpenAI server writes them (its serving_completion / serving_chat): logprobs in each
API's form, `stop_reason`, echo, one choice per `n`, a chat stream's role-only first
chunk, tool calls parsed by vLLM's parsers (engines.vllm_tool_calls). Fields vLLM
writes only for features refused here (token_ids, routed_experts, kv_transfer_params)
are left out; the app adds `usage.energy_j` and the `wattwise` block.

A renderer serves one request: `whole` renders a non-streamed response from each
choice's final chunk, `events` the stream events of one choice's chunk (it keeps what
each choice has sent: its text offset, whether its role went out, its tool parser).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from app.openai_api import ChatCompletionRequest, CompletionRequest
from engines.protocol import RequestUsage, TokenLogprobs


class ChoiceChunk(Protocol):
    """What a renderer reads of a replica's chunk (deployments.messages.ReplicaChunk)."""

    @property
    def text(self) -> str: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def stop_reason(self) -> int | str | None: ...

    @property
    def usage(self) -> RequestUsage | None: ...

    @property
    def token_ids(self) -> tuple[int, ...]: ...

    @property
    def logprobs(self) -> tuple[TokenLogprobs, ...] | None: ...

    @property
    def prompt_logprobs(self) -> tuple[TokenLogprobs, ...] | None: ...


class ToolCalls(Protocol):
    """One choice's tool-call parsing (engines.vllm_tool_calls.VllmToolCalls)."""

    def message(self, text: str, token_ids: Sequence[int], finish_reason: str | None) -> tuple[dict[str, Any], str]:
        """The whole reply's message fields (content, tool_calls) and its finish reason."""
        ...

    def delta(self, text: str, token_ids: Sequence[int], finish_reason: str | None) -> tuple[dict[str, Any] | None,
                                                                                                str | None]:
        """A streamed chunk's delta (None: nothing to send yet) and finish reason."""
        ...


def usage_dict(prompt_tokens: int, completion_tokens: int, energy_j: float) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "energy_j": round(energy_j, 6),
    }


def total_usage(usages: Sequence[RequestUsage]) -> dict[str, Any]:
    """One response's usage over its choices: the prompt once, every choice's tokens and energy."""
    return usage_dict(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages),
                      sum(u.energy_j for u in usages))


def prompt_logprobs_json(positions: tuple[TokenLogprobs, ...] | None) -> list[Any] | None:
    """vLLM's `prompt_logprobs`: per prompt token, None for the first, else its candidates by id."""
    if positions is None:
        return None
    return [None if p.logprob is None else {
        str(c.token_id): {"logprob": c.logprob, "rank": c.rank, "decoded_token": c.token} for c in p.candidates}
        for p in positions]


def completion_logprobs(positions: Sequence[TokenLogprobs], top: int, text_offset: int) -> dict[str, Any]:
    """A completion's logprobs (vLLM's _create_completion_logprobs): each token, its logprob
    and its top `top` + 1 candidates (the chosen one first) by text; offsets from
    `text_offset`."""
    offsets, offset = [], text_offset
    for p in positions:
        offsets.append(offset)
        offset += len(p.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [p.logprob for p in positions],
        "tokens": [p.token for p in positions],
        "top_logprobs": [None if p.logprob is None else {c.token: c.logprob for i, c in enumerate(p.candidates)
                                                         if top == -1 or top >= i} for p in positions],
    }


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(positions: Sequence[TokenLogprobs], top: int) -> dict[str, Any]:
    """A chat's logprobs (vLLM's _create_chat_logprobs): each token with its `top` first candidates."""
    return {"content": [{
        "token": p.token, "logprob": p.logprob, "bytes": _token_bytes(p.token),
        "top_logprobs": [{"token": c.token, "logprob": c.logprob, "bytes": _token_bytes(c.token)}
                         for i, c in enumerate(p.candidates) if top == -1 or i < top],
    } for p in positions]}


class CompletionRenderer:
    """/v1/completions' bodies for one request."""

    object_whole = object_chunk = "text_completion"

    def __init__(self, body: CompletionRequest, prompt: str) -> None:
        self.body, self.prompt = body, prompt
        self.created = int(time.time())
        self._offsets: dict[int, int] = {}  # choice -> text sent (its next logprob offset)

    def _choice(self, index: int, chunk: ChoiceChunk, first: bool) -> dict[str, Any]:
        text = chunk.text
        positions = list(chunk.logprobs or ())
        if self.body.echo and first:
            text = self.prompt + text
            positions = list(chunk.prompt_logprobs or ()) + positions
        logprobs = None
        if self.body.logprobs is not None:
            offset = self._offsets.get(index, 0)
            logprobs = completion_logprobs(positions, self.body.logprobs, offset)
        self._offsets[index] = self._offsets.get(index, 0) + len(text)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": chunk.finish_reason,
                "stop_reason": chunk.stop_reason}

    def whole(self, rid: str, model: str, finals: Sequence[ChoiceChunk]) -> dict[str, Any]:
        choices = []
        for i, chunk in enumerate(finals):
            choice = self._choice(i, chunk, True)
            choice["prompt_logprobs"] = prompt_logprobs_json(chunk.prompt_logprobs)
            choices.append(choice)
        return _body(rid, self.object_whole, self.created, model, choices, finals)

    def events(self, rid: str, model: str, index: int, chunk: ChoiceChunk, first: bool) -> list[dict[str, Any]]:
        return [_body(rid, self.object_chunk, self.created, model, [self._choice(index, chunk, first)])]


class ChatRenderer:
    """/v1/chat/completions' bodies for one request; `tool_calls(i)` gives choice i's
    parser when the request's tools are parsed (None: plain content)."""

    object_whole, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, body: ChatCompletionRequest, tool_calls: Callable[[int], ToolCalls | None]) -> None:
        self.body = body
        self.created = int(time.time())
        self._tool_calls = tool_calls
        self._parsers: dict[int, ToolCalls | None] = {}
        last = body.messages[-1]
        # vLLM's echo: the reply starts with the last message's content if it is the assistant's
        self.echo = last.text() if body.echo and last.role == "assistant" else ""

    def _parser(self, index: int) -> ToolCalls | None:
        if index not in self._parsers:
            self._parsers[index] = self._tool_calls(index)
        return self._parsers[index]

    def _logprobs(self, chunk: ChoiceChunk) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return chat_logprobs(chunk.logprobs or (), self.body.top_logprobs or 0)

    def whole(self, rid: str, model: str, finals: Sequence[ChoiceChunk]) -> dict[str, Any]:
        choices = []
        for i, chunk in enumerate(finals):
            parser = self._parser(i)
            finish = chunk.finish_reason or "stop"
            message: dict[str, Any] = {"role": "assistant", "content": chunk.text}
            if parser is not None:
                fields, finish = parser.message(chunk.text, chunk.token_ids, chunk.finish_reason)
                message.update(fields)
            if self.echo:
                message["content"] = self.echo + (message["content"] or "")
            choices.append({"index": i, "message": message, "logprobs": self._logprobs(chunk),
                            "finish_reason": finish, "stop_reason": chunk.stop_reason})
        return _body(rid, self.object_whole, self.created, model, choices, finals)

    def events(self, rid: str, model: str, index: int, chunk: ChoiceChunk, first: bool) -> list[dict[str, Any]]:
        """A first chunk of a choice is preceded by its role (with the echo, if any, as
        vLLM sends it); a tool parser may hold text back until a call is complete."""
        out = []
        if first:
            out.append(self._event(rid, model, index, {"role": "assistant", "content": self.echo}, None))
        delta: dict[str, Any] | None = {"content": chunk.text}
        finish = chunk.finish_reason
        parser = self._parser(index)
        if parser is not None:
            delta, finish = parser.delta(chunk.text, chunk.token_ids, chunk.finish_reason)
        if delta is not None or finish is not None:
            event = self._event(rid, model, index, delta or {}, self._logprobs(chunk))
            event["choices"][0].update(finish_reason=finish, stop_reason=chunk.stop_reason)
            if finish is not None:
                event["system_fingerprint"] = FINGERPRINT
            out.append(event)
        return out

    def _event(self, rid: str, model: str, index: int, delta: dict[str, Any],
               logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return _body(rid, self.object_chunk, self.created, model,
                     [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}])


Renderer = CompletionRenderer | ChatRenderer


def _fingerprint() -> str:
    try:
        return f"wattwise-{version('wattwise')}"
    except PackageNotFoundError:  # a checkout run without installing it
        return "wattwise"


# OpenAI's system_fingerprint (vLLM's names its version): on whole responses and a stream's last events.
FINGERPRINT = _fingerprint()


def _body(rid: str, obj: str, created: int, model: str, choices: list[dict[str, Any]],
          finals: Sequence[ChoiceChunk] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
    if finals is not None or any(c.get("finish_reason") for c in choices):
        body["system_fingerprint"] = FINGERPRINT
    if finals is not None:
        usages = [c.usage for c in finals if c.usage is not None]
        body["usage"] = total_usage(usages) if len(usages) == len(finals) else None
    return body


def usage_event(renderer: Renderer, rid: str, model: str, usages: Sequence[RequestUsage]) -> dict[str, Any]:
    """A stream's last event with `include_usage`: no choices, the usage of all."""
    body = _body(rid, renderer.object_chunk, renderer.created, model, [])
    body.update(usage=total_usage(usages), system_fingerprint=FINGERPRINT)
    return body
