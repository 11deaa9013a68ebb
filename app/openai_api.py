"""OpenAI wire format: request schemas, responses, and the error body.

Unknown fields are accepted and ignored (clients send many) if they are clean JSON;
OpenAI's fields are declared with their types and bounds, so bad input fails with a
4xx naming the field and /openapi.json describes every body (`openapi_body`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
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
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
_CHAT_ONLY_REFUSED = ("chat_template", "documents", "media_io_kwargs", "mm_processor_kwargs", "reasoning_effort",
                      "include_reasoning", "return_prompt_text")


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
_RULE_FIELD = re.compile(r"^([a-z_][a-z_.]*): ")


def invalid_request(exc: ValidationError) -> APIError:
    """A 400 naming the first bad field (its JSON path) and what is allowed there."""
    first = exc.errors(include_url=False, include_input=False)[0]
    # Union members and dict keys add tags to the path ("function-after[...]", "str",
    # "[key]"): keep only field names, keys and indices.
    loc = [str(p) for p in first["loc"] if isinstance(p, int) or not (_LOC_TAG.search(str(p)) or p in _TYPE_TAGS)]
    msg = first["msg"].removeprefix("Value error, ")
    if not loc and (named := _RULE_FIELD.match(msg)):  # a rule across fields names the one it refuses
        loc, msg = [named.group(1)], msg[named.end():]
    param = ".".join(loc) or None
    return APIError(400, f"Invalid value for '{param}': {msg}" if param else f"Invalid request: {msg}", param=param)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(default=False, description="Refused: usage comes with the last chunk only.")

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, v: bool) -> bool:
        if v:
            raise ValueError("usage is reported once, with the last chunk (include_usage)")
        return v


def _clean_json(value: Any) -> Any:
    """Free-form JSON (a schema, a tool's parameters) is held to what unknown fields are."""
    _check_extra(value, "json")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_clean_json)]
MAX_TOOLS = 128
MAX_N = 16

# vLLM request fields this app does not serve, with vLLM's default: a request that sets one
# to anything else gets a 400 naming it (never a silent drop). Why each: docs/operations.md.
REFUSED: dict[str, Any] = {
    "use_beam_search": False, "length_penalty": 1.0, "prompt_embeds": None, "truncate_prompt_tokens": None,
    "truncation_side": None, "logprob_token_ids": None, "return_tokens_as_token_ids": False,
    "return_token_ids": False, "return_token_offsets": False, "return_prompt_text": False,
    "kv_transfer_params": None, "ec_transfer_params": None, "vllm_xargs": None, "priority": 0, "cache_salt": None,
    "chat_template": None, "documents": None, "media_io_kwargs": None, "mm_processor_kwargs": None,
    "watermarking": False, "repetition_detection": None, "thinking_token_budget": None, "reasoning_effort": None,
    "include_reasoning": True, "stream_interval": None, "mm_payload": "tensors", "return_mm_kwargs": False,
    "routed_experts_prompt_start": 0, "spaces_between_special_tokens": True, "session_id": None,
    "request_id": None, "add_special_tokens": None,
}


def _refused(name: str, value: Any) -> None:
    if value is not None and value != REFUSED[name]:
        raise ValueError(f"not served here (vLLM's default, {json.dumps(REFUSED[name])}, is)")


class ResponseJsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    json_schema: JsonObject | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: ResponseJsonSchema | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs the 'json_schema' field")
        return self


class StructuredOutputs(_Strict):
    """vLLM's extension: one constraint on the text (json, regex, choice, grammar, json_object)."""

    json_: JsonObject | Text | None = Field(default=None, alias="json")
    regex: Text | None = Field(default=None, max_length=10_000)
    choice: list[Text] | None = Field(default=None, min_length=1, max_length=256)
    grammar: Text | None = Field(default=None, max_length=100_000)
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Text | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        kinds = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("exactly one of json, regex, choice, grammar or json_object")
        return self


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: Text = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N, description="Choices per request (each served as a request).")
    user: Text | None = Field(default=None, max_length=256)
    # Sampling (app.sampling -> core.sampling.Sampling): vLLM's names, defaults and meaning.
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="vLLM's extension: 0 or -1 for all tokens.")
    min_p: float | None = Field(default=None, ge=0, le=1, description="vLLM's extension.")
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    ignore_eos: bool = Field(default=False, description=(
        "vLLM's extension: generate max_tokens tokens, past any end-of-sequence token."))
    min_tokens: int = Field(default=0, ge=0, le=1_000_000, description="vLLM's extension.")
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2, description="vLLM's extension.")
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS)
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1,
                                                                      max_length=MAX_LOGIT_BIAS)
    bad_words: list[Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS, description=(
        "vLLM's extension: candidates per prompt token (not with stream)."))
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's fields refused here (REFUSED): declared so a request setting one gets a 400 naming it.
    use_beam_search: Any = Field(default=None, description="Refused (see REFUSED).")
    length_penalty: Any = Field(default=None, description="Refused (see REFUSED).")
    prompt_embeds: Any = Field(default=None, description="Refused (see REFUSED).")
    truncate_prompt_tokens: Any = Field(default=None, description="Refused (see REFUSED).")
    truncation_side: Any = Field(default=None, description="Refused (see REFUSED).")
    logprob_token_ids: Any = Field(default=None, description="Refused (see REFUSED).")
    return_tokens_as_token_ids: Any = Field(default=None, description="Refused (see REFUSED).")
    return_token_ids: Any = Field(default=None, description="Refused (see REFUSED).")
    return_token_offsets: Any = Field(default=None, description="Refused (see REFUSED).")
    kv_transfer_params: Any = Field(default=None, description="Refused (see REFUSED).")
    ec_transfer_params: Any = Field(default=None, description="Refused (see REFUSED).")
    vllm_xargs: Any = Field(default=None, description="Refused (see REFUSED).")
    priority: Any = Field(default=None, description="Refused (see REFUSED).")
    cache_salt: Any = Field(default=None, description="Refused (see REFUSED).")
    watermarking: Any = Field(default=None, description="Refused (see REFUSED).")
    repetition_detection: Any = Field(default=None, description="Refused (see REFUSED).")
    thinking_token_budget: Any = Field(default=None, description="Refused (see REFUSED).")
    stream_interval: Any = Field(default=None, description="Refused (see REFUSED).")
    mm_payload: Any = Field(default=None, description="Refused (see REFUSED).")
    return_mm_kwargs: Any = Field(default=None, description="Refused (see REFUSED).")
    routed_experts_prompt_start: Any = Field(default=None, description="Refused (see REFUSED).")
    spaces_between_special_tokens: Any = Field(default=None, description="Refused (see REFUSED).")
    session_id: Any = Field(default=None, description="Refused (see REFUSED).")
    request_id: Any = Field(default=None, description="Refused (see REFUSED).")
    add_special_tokens: Any = Field(default=None, description="Refused (see REFUSED).")

    @field_validator(*(n for n in REFUSED if n not in _CHAT_ONLY_REFUSED), mode="before")
    @classmethod
    def _refuse(cls, value: Any, info: ValidationInfo) -> Any:
        _refused(str(info.field_name), value)
        return value

    @model_validator(mode="after")
    def _clean_extra(self) -> _Common:
        for name, value in (self.model_extra or {}).items():
            _check_extra(value, name)
        return self

    @model_validator(mode="after")
    def _vllm_rules(self) -> _Common:
        """What vLLM's server refuses with 400 too."""
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only with stream=true")
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"n: must be 1 when using greedy sampling (temperature 0), got {self.n}")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs: not available with stream=true")
        if self.response_format is not None and self.response_format.type != "text" \
                and self.structured_outputs is not None:
            raise ValueError("structured_outputs: one constraint at a time (response_format sets one)")
        return self


class CompletionRequest(_Common):
    prompt: Text | list[Text] = Field(description="One prompt (a string, or a list of exactly one string).")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: Text | None = Field(default=None, max_length=10_000, description=(
        "Refused, as vLLM refuses it for models without fill-in-the-middle rendering."))

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

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("suffix is only supported for models with FIM completion rendering")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: Text = Field(min_length=1, max_length=64)
    arguments: Text = Field(max_length=1_000_000)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    id: Text = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[TextPart] | None = None
    name: Text | None = Field(default=None, min_length=1, max_length=64)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: Text | None = Field(default=None, max_length=256)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (vLLM's conversation form): text content,
        and a tool call's arguments as an object."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": c.type, "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in self.tool_calls]
        return out


def messages_text(messages: list[ChatMessage]) -> str:
    """Chat messages as one text where no chat template renders them (the modelled engine)."""
    return "\n".join(f"{m.role}: {m.text()}" for m in messages)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: Text = Field(min_length=1, max_length=64)
    description: Text | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: Text = Field(min_length=1, max_length=64)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(default=False, description=(
        "vLLM's extension: the reply starts with the last message's content if it is the assistant's."))
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: JsonObject | None = None
    # vLLM's chat-only fields refused here (REFUSED).
    chat_template: Any = Field(default=None, description="Refused (see REFUSED).")
    documents: Any = Field(default=None, description="Refused (see REFUSED).")
    media_io_kwargs: Any = Field(default=None, description="Refused (see REFUSED).")
    mm_processor_kwargs: Any = Field(default=None, description="Refused (see REFUSED).")
    reasoning_effort: Any = Field(default=None, description="Refused (see REFUSED).")
    include_reasoning: Any = Field(default=None, description="Refused (see REFUSED).")
    return_prompt_text: Any = Field(default=None, description="Refused (see REFUSED).")

    @field_validator(*_CHAT_ONLY_REFUSED, mode="before")
    @classmethod
    def _refuse_chat(cls, value: Any, info: ValidationInfo) -> Any:
        _refused(str(info.field_name), value)
        return value

    @model_validator(mode="after")
    def _tools_rules(self) -> ChatCompletionRequest:
        """vLLM's: a tool choice needs tools, a named one a tool of that name; one message
        continued or a generation prompt, not both."""
        choice = self.tool_choice
        if choice is not None and choice != "none" and not self.tools:
            raise ValueError("tool_choice: needs 'tools'")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in
                                                                                 self.tools or ()}:
            raise ValueError(f"tool_choice: no tool named {choice.function.name!r} in 'tools'")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message: set add_generation_prompt to false with it")
        return self

    def prompt_text(self) -> str:
        return messages_text(self.messages)

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """vLLM's default: "auto" when tools are given, else "none"."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TokenizeCompletionRequest(_Strict):
    """vLLM's /tokenize of a prompt."""

    model: Text = Field(min_length=1, max_length=256)
    prompt: Text
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Strict):
    """vLLM's /tokenize of chat messages, rendered as a chat completion renders them."""

    model: Text = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_TOOLS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: JsonObject | None = None
    add_special_tokens: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: Text = Field(min_length=1, max_length=256)
    tokens: list[Annotated[int, Field(ge=0, lt=2**31)]] = Field(max_length=1_000_000)


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
