"""Input hardening in process: the published OpenAPI spec and field validation (bad input is
a 400 in OpenAI's format, naming the field). tests/ray/test_http_guards.py fuzzes the spec
against the running app."""

from typing import Any

import pytest
from pydantic import ValidationError

from app.openai_api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    invalid_request,
)

MODEL = "llama2-70b-sim"


def _spec() -> dict[str, Any]:
    from deployments.ingress import openapi_spec

    return openapi_spec()


@pytest.mark.parametrize(("path", "fields"), [
    ("/v1/completions", {"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "n", "logit_bias"}),
    ("/v1/chat/completions", {"model", "messages", "max_completion_tokens", "stream", "user", "seed"}),
    ("/v1/batches", {"input_file_id", "endpoint", "completion_window"}),
    ("/admin/clocks", {"pool", "clock_mhz"}),
    ("/admin/drain", {"pool", "drain"}),
    ("/admin/tensor_parallel", {"pool", "tensor_parallel"}),
])
def test_openapi_describes_the_request_bodies(path: str, fields: set[str]) -> None:
    body = _spec()["paths"][path]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] and fields <= set(schema["properties"])
    assert "$defs" not in str(schema) and "$ref" not in str(schema)  # self-contained for fuzzers


def test_chat_message_schema_lists_the_roles() -> None:
    schema = _spec()["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    role = schema["properties"]["messages"]["items"]["properties"]["role"]
    assert set(role["enum"]) == {"system", "user", "assistant", "tool", "developer"}


def _rejected(schema: type, body: dict[str, Any]) -> APIError:
    with pytest.raises(ValidationError) as err:
        schema.model_validate(body)
    return invalid_request(err.value)


@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 17}, "n"), ({"n": 2, "temperature": 0}, "n"), ({"temperature": 2.5}, "temperature"),
    ({"temperature": "1"}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10**7}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"stream": "yes"}, "stream"), ({"stop": ["a"] * 5}, "stop"),
    ({"stop": "x" * 257}, "stop"), ({"stop": [""]}, "stop"), ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
    ({"logit_bias": {"42": 101}}, "logit_bias.42"), ({"user": "u" * 257}, "user"), ({"prompt": "\ud800"}, "prompt"),
    ({"prompt": ["ok", "\udfff"]}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "  "}, "prompt"),
    ({"prompt": [1, 2]}, "prompt"), ({"seed": 2**64}, "seed"), ({"logprobs": 21}, "logprobs"),
    ({"use_beam_search": True}, "use_beam_search"), ({"suffix": "x"}, "suffix"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
])
def test_bad_completion_fields_are_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    err = _rejected(CompletionRequest, {"model": MODEL, "prompt": "hi", **extra})
    assert (err.status, err.param) == (400, param) and f"'{param}'" in err.message


@pytest.mark.parametrize(("messages", "param"), [
    ([], "messages"), ([{"role": "wizard", "content": "x"}], "messages.0.role"),
    ([{"role": "user", "content": 5}], "messages.0.content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}], "messages.0.content"),
    ([{"role": "user", "content": "ok"}, {"role": "user", "content": "half\ud83d"}], "messages.1.content"),
    ([{"role": "user", "content": "x", "name": "n" * 65}], "messages.0.name"),
])
def test_bad_chat_messages_are_400_naming_the_field(messages: list, param: str) -> None:
    err = _rejected(ChatCompletionRequest, {"model": MODEL, "messages": messages})
    assert (err.status, err.param) == (400, param)


def test_ignore_eos_reaches_the_engines_sampling() -> None:
    """vLLM's extension: a benchmark replaying output lengths asks for max_tokens past EOS."""
    from app.sampling import sampling_of

    body = {"model": MODEL, "prompt": "hi"}
    assert sampling_of(CompletionRequest.model_validate({**body, "ignore_eos": True})).ignore_eos
    assert not sampling_of(CompletionRequest.model_validate(body)).ignore_eos


def test_unknown_fields_pass_but_must_be_clean() -> None:
    ok = CompletionRequest.model_validate({"model": MODEL, "prompt": "hi", "best_of": 1, "metadata": {"a": ["b"]}})
    assert ok.model_extra == {"best_of": 1, "metadata": {"a": ["b"]}}
    err = _rejected(CompletionRequest, {"model": MODEL, "prompt": "hi", "metadata": {"a": ["b\ud800"]}})
    assert err.status == 400 and "metadata.a.0" in err.message


def test_nul_is_accepted_as_vllm_accepts_it() -> None:
    """NUL is a valid JSON string character; vLLM's OpenAI server tokenizes it, and
    `vllm bench serve` sends such prompts: the text reaches the engine unchanged."""
    assert CompletionRequest.model_validate({"model": MODEL, "prompt": "a\x00b"}).prompt == "a\x00b"
    chat = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "nul\x00"}], "metadata": {"a": ["b\x00"]}})
    assert chat.messages[0].content == "nul\x00"
