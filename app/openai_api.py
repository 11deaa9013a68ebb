"""OpenAI wire format: request schemas, responses, and the error body.

Unknown sampling fields are accepted and ignored (clients send many); fields we act
on are validated strictly so bad input fails with a 4xx naming the field.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class APIError(Exception):
    """An error the client can act on, rendered as OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    user: str | None = Field(default=None, max_length=256)


class CompletionRequest(_Common):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request is supported")
            v = v[0]
        if not v.strip():
            raise ValueError("prompt must not be empty")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return " ".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)

    def prompt_text(self) -> str:
        return "\n".join(f"{m.role}: {m.text()}" for m in self.messages)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def usage_dict(prompt_tokens: int, completion_tokens: int, energy_j: float) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "energy_j": round(energy_j, 6),
    }


def completion_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None, chunk: bool) -> dict:
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None or not chunk:
        body["usage"] = usage
    return body


def chat_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None, chunk: bool) -> dict:
    if chunk:
        choice = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        obj = "chat.completion"
    body = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if usage is not None or not chunk:
        body["usage"] = usage
    return body
