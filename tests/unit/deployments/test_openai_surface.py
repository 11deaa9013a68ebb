"""The OpenAI surface on an app of modelled replicas (in process, no Ray): what the modelled
engine honours (max_tokens, stop, n, echo) is answered as vLLM's server answers it, what
only a real engine honours is a 400 naming the parameter, vLLM's refused fields likewise;
/tokenize, /detokenize, /v1/models and /v1/embeddings. The same requests on vLLM:
tests/vllm/test_openai_parity.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from app.config import AppConfig
from core.paths import SERVE_CONFIG
from core.token_counter import default_token_counter
from deployments.ingress import Ingress
from engines.modelled_engine import placeholder_text
from tests.in_process_app import sim_ingress

MODEL = "llama2-70b-sim"
CHAT = [{"role": "user", "content": "tell me a story"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def ingress() -> Ingress:
    args = yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]
    return sim_ingress(AppConfig.model_validate(args).resolved())


@pytest.fixture(scope="module")
def client(ingress: Ingress) -> Iterator[TestClient]:
    with TestClient(ingress.http_app()) as c:
        yield c


def _post(client: TestClient, route: str, **body: Any) -> Any:
    return client.post(route, json={"model": MODEL, "max_tokens": 12, **body})


def _refused(response: Any, param: str, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    return str(error["message"])


@pytest.mark.parametrize(("route", "extra", "param"), [
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ("/v1/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/completions", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ("/v1/completions", {"presence_penalty": -1.0}, "presence_penalty"),
    ("/v1/completions", {"repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/completions", {"logit_bias": {"42": 5}}, "logit_bias"),
    ("/v1/completions", {"top_k": 5}, "top_k"),
    ("/v1/completions", {"min_p": 0.1}, "min_p"),
    ("/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"tools": TOOLS}, "tool_choice"),  # "auto" by default, as vLLM's
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
])
def test_what_only_a_real_engine_honours_is_a_400_naming_it(client: TestClient, route: str, extra: dict[str, Any],
                                                             param: str) -> None:
    body = {"messages": CHAT} if "chat" in route else {"prompt": "tell me a story"}
    _refused(_post(client, route, **body, **extra), param)


@pytest.mark.parametrize(("extra", "param"), [
    ({"use_beam_search": True}, "use_beam_search"), ({"suffix": "x"}, "suffix"), ({"priority": 3}, "priority"),
    ({"return_token_ids": True}, "return_token_ids"), ({"n": 2, "temperature": 0}, "n"),
])
def test_vllms_fields_not_served_here_are_a_400_naming_them(client: TestClient, extra: dict[str, Any],
                                                           param: str) -> None:
    _refused(_post(client, "/v1/completions", prompt="hi", **extra), param)
    # at their defaults they pass
    assert _post(client, "/v1/completions", prompt="hi", use_beam_search=False, priority=0).status_code == 200


def test_neutral_values_and_tools_without_a_choice_pass(client: TestClient) -> None:
    r = _post(client, "/v1/chat/completions", messages=CHAT, frequency_penalty=0, top_k=-1, tools=TOOLS,
              tool_choice="none", response_format={"type": "text"}, logprobs=False, temperature=0.7, seed=3)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def test_a_stop_string_ends_the_text_before_it_as_vllm_does(client: TestClient) -> None:
    """64 placeholder tokens hold each of the modelled engine's 64 words once, wherever the
    request's id starts them: " of" is somewhere in them (60 missed it for 4 ids in 64)."""
    def complete(**extra: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
        r = _post(client, "/v1/completions", prompt="tell me a story", max_tokens=64, **extra).json()
        return placeholder_text(r["id"].removeprefix("cmpl-"), 0, 64), r["choices"][0], r["usage"]

    full, choice, usage = complete(stop=[" of", "zzz"])
    at = full.find(" of")
    assert at >= 0
    assert choice["text"] == full[:at] and choice["finish_reason"] == "stop" and choice["stop_reason"] == " of"
    assert usage["completion_tokens"] == len(full[:at].split()) + 1  # the stop string's token was made
    full, choice, _ = complete(stop=" of", include_stop_str_in_output=True)
    assert choice["text"] == full[:full.find(" of") + 3]
    full, choice, _ = complete(stop=" of", min_tokens=64)  # stop strings count only after min_tokens
    assert choice["text"] == full and choice["finish_reason"] == "length" and choice["stop_reason"] is None


def test_n_choices_each_served_and_counted(client: TestClient) -> None:
    r = _post(client, "/v1/completions", prompt="tell me a story", n=3, max_tokens=5).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    texts = [c["text"] for c in r["choices"]]
    assert len(set(texts)) == 3 and all(len(t.split()) == 5 for t in texts)
    assert r["usage"]["completion_tokens"] == 15 and r["usage"]["energy_j"] > 0
    rid = r["id"].removeprefix("cmpl-")
    assert texts == [placeholder_text(rid, 0, 5), placeholder_text(f"{rid}-1", 0, 5),
                     placeholder_text(f"{rid}-2", 0, 5)]


def test_n_streamed_choices_interleave_and_each_ends(client: TestClient) -> None:
    r = _post(client, "/v1/chat/completions", messages=CHAT, n=2, max_tokens=6, stream=True,
              stream_options={"include_usage": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text: dict[int, str] = {0: "", 1: ""}
    finishes = {}
    for e in events[:-1]:
        choice = e["choices"][0]
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length"} and all(len(t.split()) == 6 for t in text.values())
    assert events[-1]["usage"]["completion_tokens"] == 12 and r.text.endswith("data: [DONE]\n\n")


def test_echo_starts_the_text_with_the_prompt_or_the_assistants_message(client: TestClient) -> None:
    r = _post(client, "/v1/completions", prompt="tell me a story", echo=True, max_tokens=3).json()
    assert r["choices"][0]["text"].startswith("tell me a story ")
    chat = [*CHAT, {"role": "assistant", "content": "Once"}]
    r = _post(client, "/v1/chat/completions", messages=chat, echo=True, max_tokens=3).json()
    assert r["choices"][0]["message"]["content"].startswith("Once ")
    r = _post(client, "/v1/chat/completions", messages=CHAT, echo=True, max_tokens=3).json()  # last is the user's
    assert not r["choices"][0]["message"]["content"].startswith("tell")


def test_tokenize_detokenize_models_and_embeddings(client: TestClient, ingress: Ingress) -> None:
    counter = default_token_counter()
    r = client.post("/tokenize", json={"model": MODEL, "prompt": "tell me a story", "return_token_strs": True})
    body = r.json()
    assert body["tokens"] == counter.encode("tell me a story") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == ingress.config.max_context_tokens and len(body["token_strs"]) == body["count"]
    chat = client.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()
    assert chat["count"] == counter.count("user: tell me a story")  # the modelled engine's prompt text
    assert client.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]}).json() == {
        "prompt": "tell me a story"}
    _refused(client.post("/tokenize", json={"model": "nope", "prompt": "x"}), "model", 404)
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["max_model_len"] == ingress.config.max_context_tokens
    assert card["permission"][0]["allow_logprobs"] is False  # placeholder tokens have none
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert r.status_code == 404 and "embedding" in r.json()["error"]["message"]
