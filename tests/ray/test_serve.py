"""The Serve path end to end: real Ray, real HTTP, the real openai client."""

import json
import time

import httpx
import openai
import pytest

from core.token_counter import count_tokens
from tests.factories import BATCH_KEY, INTERACTIVE_KEY, LIMITED_KEY
from tests.live_app import metric_sum, under_load, wait_for
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"


def _client(served: LocalServe, key: str = INTERACTIVE_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def _words(n: int) -> str:
    return " ".join(["word"] * n)


def test_models(served: LocalServe) -> None:
    assert [m.id for m in _client(served).models.list()] == [MODEL]


def test_completion_reports_tokens_energy_and_slo(served: LocalServe) -> None:
    resp = _client(served).completions.create(model=MODEL, prompt=_words(40), max_tokens=12)
    assert resp.usage.prompt_tokens == 40 and resp.usage.completion_tokens == 12
    assert len(resp.choices[0].text.split()) == 12
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.model_extra["energy_j"] > 0
    report = resp.model_extra["wattwise"]
    assert report["pool"] == "pool-short" and report["service_class"] == "interactive"
    assert 0 < report["ttft_s"] <= report["e2e_s"]


def test_chat_streaming(served: LocalServe) -> None:
    stream = _client(served).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": _words(30)}], max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, chunks = "", None, 0
    for chunk in stream:
        chunks += 1
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert len(text.split()) == 40 and count_tokens(text) == 40  # the client's count is the engine's
    assert usage is not None and usage.completion_tokens == 40
    # Streamed, not in one piece; never more than a chunk per token (+ the role and usage
    # chunks). Tokens share a chunk when steps are faster than the flush, not when slower.
    assert 2 < chunks <= usage.completion_tokens + 2


def test_chat_stream_names_the_role_once(served: LocalServe) -> None:
    """As in OpenAI's streams, only the first delta carries the role."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "stream": True}
    with httpx.stream("POST", f"{served.base_url}/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {INTERACTIVE_KEY}"}) as resp:
        events = [json.loads(line.removeprefix("data: ")) for line in resp.iter_lines()
                  if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert len(deltas) >= 2
    assert deltas[0]["role"] == "assistant"
    assert all("role" not in d for d in deltas[1:])
    assert count_tokens("".join(d["content"] for d in deltas)) == 30


@pytest.mark.parametrize(("tokens", "pool"), [(255, "pool-short"), (256, "pool-medium"), (1023, "pool-medium"),
                                              (1024, "pool-long")])
def test_classification_boundaries(served: LocalServe, tokens: int, pool: str) -> None:
    # Chat prompts gain the role prefix ("user: ", two tokens); each " word" is one token.
    prefix = count_tokens("user: word") - 1
    content = _words(tokens - prefix)
    assert count_tokens(f"user: {content}") == tokens
    resp = _client(served).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2
    )
    assert resp.model_extra["wattwise"]["pool"] == pool


def test_service_class_comes_from_the_key(served: LocalServe) -> None:
    resp = _client(served, BATCH_KEY).completions.create(model=MODEL, prompt="hi", max_tokens=2)
    report = resp.model_extra["wattwise"]
    assert report["service_class"] == "batch" and report["slo_ttft_s"] == 3600


def _post(served: LocalServe, body: bytes | str, key: str | None = INTERACTIVE_KEY) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{served.base_url}/v1/completions", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("{not json", 400, "invalid_json"),
        ("[1, 2]", 400, "invalid_json"),
        (json.dumps({"model": "gpt-17", "prompt": "hi"}), 404, "model_not_found"),
        (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": -5}), 400, None),
        (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}), 400, None),
        (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 9000}), 400, "context_length_exceeded"),
        (json.dumps({"model": MODEL, "prompt": _words(9000)}), 400, "context_length_exceeded"),
        (json.dumps({"model": MODEL, "prompt": ""}), 400, None),
        (json.dumps({"model": MODEL}), 400, None),
    ],
)
def test_bad_input_gets_openai_error(served: LocalServe, body: str, status: int, code: str | None) -> None:
    resp = _post(served, body)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] == code


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_bad_api_key_is_401(served: LocalServe, key: str | None) -> None:
    resp = _post(served, json.dumps({"model": MODEL, "prompt": "hi"}), key=key)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(served, "sk-wrong").completions.create(model=MODEL, prompt="hi", max_tokens=2)


def test_client_disconnect_frees_the_slot(served: LocalServe) -> None:
    client = _client(served)
    stream = client.completions.create(model=MODEL, prompt=_words(2000), max_tokens=4000, stream=True)
    next(iter(stream))
    wait_for(lambda: metric_sum(served, "ray_wattwise_num_requests_running", pool="long") >= 1, 60, "running")
    stream.close()
    wait_for(lambda: metric_sum(served, "ray_wattwise_num_requests_running", pool="long") == 0, 60, "slot freed")


def test_metrics_and_spans_appear(served: LocalServe) -> None:
    _client(served).completions.create(model=MODEL, prompt="hello there", max_tokens=3)
    for name in (
        "ray_wattwise_time_to_first_token_seconds_bucket",
        "ray_wattwise_e2e_request_latency_seconds_bucket",
        "ray_wattwise_generation_tokens_total",
        "ray_wattwise_request_energy_joules_total",
        "ray_wattwise_power_watts",
        "ray_wattwise_gpu_clock_mhz",
    ):
        wait_for(lambda n=name: metric_sum(served, n) > 0, 60, name)
    wait_for(lambda: served.spans_path.exists() and "wattwise.classify" in served.spans_path.read_text(), 30, "spans")


def _replicas(served: LocalServe, pool: str) -> int:
    return served.pool_replicas()[pool]


def test_autoscaling_raises_and_lowers_replicas(served: LocalServe) -> None:
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=INTERACTIVE_KEY, max_retries=0, timeout=120)

    def send() -> None:
        client.completions.create(model=MODEL, prompt="short prompt", max_tokens=400)

    # 24 long-running requests at a time on one replica: 6x its target of 4.
    assert _replicas(served, "pool-short") == 1
    assert under_load(send, clients=24, until=lambda: _replicas(served, "pool-short") >= 2, timeout_s=300), \
        f"no second replica under load: {served.pool_status()}"
    wait_for(lambda: _replicas(served, "pool-short") == 1, 90, "scale back down to 1")


def test_rate_limited_tenant_gets_429_with_retry_after(served: LocalServe) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
    # The tenant's limit (0.2 requests/s, a burst of 1) holds for the app, not per ingress
    # replica: of 8 requests spread over the two replicas, only the burst and what refilled
    # meanwhile go through.
    started_s = time.monotonic()
    replies = [_post(served, body, key=LIMITED_KEY) for _ in range(8)]
    statuses = [r.status_code for r in replies]
    assert statuses[0] == 200 and set(statuses) == {200, 429}
    assert statuses.count(200) <= 1 + 0.2 * (time.monotonic() - started_s)
    # A refusal as the client got it (one sent after the eight may find the bucket refilled
    # on a slow machine: the limit refills every 5 s).
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 5
    client = _client(served, LIMITED_KEY)
    with pytest.raises(openai.RateLimitError):  # the openai client sees a refusal as one
        for _ in range(8):
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    # Other tenants are not affected.
    assert _post(served, body).status_code == 200
