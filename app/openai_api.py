"""OpenAI wire format: request schemas, responses, and the error body.

Unknown fields are accepted and ignored (clients send many) if they are clean JSON;
OpenAI's fields are declared with their types and bounds, so bad input fails with a
4xx naming the field and /openapi.json describes every body (`openapi_body`).
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


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


MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 300
MAX_MESSAGES = 4096
MAX_EXTRA_DEPTH = 16


def _clean_text(value: str) -> str:
    """Strings reach tokenizers, logs and C code: they must be encodable as UTF-8 (no lone
    surrogate, which a JSON `\\ud800` escape can produce; a Rust tokenizer cannot take one).
    NUL is a valid JSON string character that vLLM's OpenAI server accepts and tokenizes
    (benchmark clients send it), so it is accepted here too."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 (it has a lone surrogate escape)") from None
    return value


Text = Annotated[str, AfterValidator(_clean_text)]
StopSequence = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenId = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]


def _check_extra(value: Any, path: str, depth: int = 0) -> None:
    """Unknown fields are accepted (clients send many) but must be clean, shallow JSON."""
    if depth > MAX_EXTRA_DEPTH:
        raise ValueError(f"field '{path}' is nested deeper than {MAX_EXTRA_DEPTH} levels")
    if isinstance(value, str):
        try:
            _clean_text(value)
        except ValueError as exc:
            raise ValueError(f"field '{path}' {exc}") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_extra(k, path, depth + 1)
            _check_extra(v, f"{path}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_extra(v, f"{path}.{i}", depth + 1)


class _Strict(BaseModel):
    """JSON types as declared: no "1" for 1 or "true" for true."""

    model_config = ConfigDict(extra="forbid", strict=True)


_LOC_TAG = re.compile(r"[\[(]")
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def invalid_request(exc: ValidationError) -> APIError:
    """A 400 naming the first bad field (its JSON path) and what is allowed there."""
    first = exc.errors(include_url=False, include_input=False)[0]
    # Union members and dict keys add tags to the path ("function-after[...]", "str",
    # "[key]"): keep only field names, keys and indices.
    loc = [str(p) for p in first["loc"] if isinstance(p, int) or not (_LOC_TAG.search(str(p)) or p in _TYPE_TAGS)]
    param = ".".join(loc) or None
    msg = first["msg"].removeprefix("Value error, ")
    return APIError(400, f"Invalid value for '{param}': {msg}" if param else f"Invalid request: {msg}", param=param)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: Text = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request is supported.")
    user: Text | None = Field(default=None, max_length=256)
    # Sampling (app.sampling hands them to the engine; the sim engine ignores them).
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    ignore_eos: bool = Field(default=False, description=(
        "vLLM's extension: generate max_tokens tokens, past any end-of-sequence token."))
    # Accepted for compatibility and validated; no engine here acts on them.
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS)

    @model_validator(mode="after")
    def _clean_extra(self) -> _Common:
        for name, value in (self.model_extra or {}).items():
            _check_extra(value, name)
        return self


class CompletionRequest(_Common):
    prompt: Text | list[Text] = Field(description="One prompt (a string, or a list of exactly one string).")
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: Text | None = Field(default=None, max_length=10_000)

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


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None
    name: Text | None = Field(default=None, min_length=1, max_length=64)

    def text(self) -> str:
        if isinstance(self.content, list):
            return " ".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def prompt_text(self) -> str:
        return "\n".join(f"{m.role}: {m.text()}" for m in self.messages)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class BatchCreateRequest(_Strict):
    input_file_id: Text = Field(min_length=1, max_length=256)
    endpoint: Literal["/v1/completions", "/v1/chat/completions"]
    completion_window: Literal["24h", "1h"]  # app.batch_store.WINDOWS_S
    metadata: dict[Annotated[Text, Field(max_length=64)], Annotated[Text, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its raw body: the model's JSON schema as the
    request body (refs inlined: the schemas are small and not recursive)."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": _inline_refs(schema, schema.get("$defs", {}))}}}}


def usage_dict(prompt_tokens: int, completion_tokens: int, energy_j: float) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "energy_j": round(energy_j, 6),
    }


def completion_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None, chunk: bool,
                    first_chunk: bool = False) -> dict:
    """A text completion, or one of its stream chunks (`first_chunk` changes nothing here)."""
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


def chat_body(rid: str, model: str, text: str, finish: str | None, usage: dict | None, chunk: bool,
              first_chunk: bool = False) -> dict:
    """A chat completion, or one of its stream chunks. As OpenAI's (and vLLM's) streams do,
    only the first chunk's delta carries the role; clients that concatenate deltas field by
    field would otherwise read "assistantassistant..."."""
    if chunk:
        delta = {"role": "assistant", "content": text} if first_chunk else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        obj = "chat.completion"
    body = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if usage is not None or not chunk:
        body["usage"] = usage
    return body
