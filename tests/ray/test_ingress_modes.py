"""The ingress modes other than the default (wattwise/ingress_mode.py; every other Ray test
runs HAProxy) must keep what clients rely on: bearer-token auth, SSE streaming, OpenAI-format
4xx with their headers and our Prometheus metrics, over real HTTP. Serve's proxy is the
fallback (WATTWISE_INGRESS=proxy); direct ingress is measured by `wattwise bench ingress`
(docs/operations.md, "Serve's fast path") but not offered: it does not balance.

The app behind the proxy is Mico in the Serve path (the text predictor in the ingress, the
token-balanced router in the pools), tested here too: one cluster for both, as each start
costs ~70 s of CPU on a 2-core CI machine, and neither test depends on the other's part."""

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.factories import INTERACTIVE_KEY, LIMITED_KEY, one_entry, quick_config
from tests.live_app import metric_sum, wait_for
from wattwise.ingress_mode import IngressMode
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"


def _token_routed(config: dict[str, Any]) -> None:
    """The test keys; two replicas of the short pool behind the token-balanced router, one of the others."""
    quick_config(config)
    one_entry(config)
    for pool in config["applications"][0]["args"]["pools"]:
        pool["request_router"] = "token_balanced"
        replicas = 2 if pool["name"] == "short" else 1
        pool["autoscaling"].update({"min_replicas": replicas, "max_replicas": replicas, "initial_replicas": replicas})


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServe]:
    with LocalServe(edit=_token_routed, ingress=IngressMode.PROXY, dashboard=False) as local:
        yield local


def _post(url: str, body: dict | bytes, key: str | None = INTERACTIVE_KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/completions", content=content,
                      headers={**headers, "content-type": "application/json"}, timeout=60)


@pytest.mark.ray
def test_auth_errors_streaming_and_metrics(served: LocalServe) -> None:
    url = served.url()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=INTERACTIVE_KEY, max_retries=0, timeout=60)
    reply = client.completions.create(model=MODEL, prompt="hello there", max_tokens=4)
    assert reply.usage is not None and reply.usage.completion_tokens == 4 and reply.model_extra["wattwise"]

    chunks = list(client.completions.create(model=MODEL, prompt="hello there", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)  # tokens arrived as SSE events
    with httpx.stream("POST", f"{url}/v1/completions", headers={"authorization": f"Bearer {INTERACTIVE_KEY}"},
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}, timeout=60) as sse:
        assert sse.headers["content-type"].startswith("text/event-stream")
        assert [line for line in sse.iter_lines() if line.startswith("data:")][-1] == "data: [DONE]"

    wrong = _post(url, {"model": MODEL, "prompt": "x"}, key="sk-wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    bad = _post(url, {"model": MODEL, "prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert _post(url, b"{not json").status_code == 400
    limited = [_post(url, {"model": MODEL, "prompt": "x", "max_tokens": 1}, key=LIMITED_KEY) for _ in range(3)]
    assert limited[-1].status_code == 429 and int(limited[-1].headers["retry-after"]) >= 1

    # Ray exports the ingress's counters every ~10 s.
    for status in ("200", "400", "401", "429"):
        wait_for(lambda s=status: metric_sum(served, "ray_wattwise_http_responses_total", status=s) > 0, 90,
                 f"http_responses_total{{status={status}}}")


@pytest.mark.ray
def test_requests_through_the_token_router_all_complete(served: LocalServe) -> None:
    client = openai.OpenAI(base_url=f"{served.url()}/v1", api_key=INTERACTIVE_KEY, max_retries=0, timeout=60)
    prompts = [" ".join(["word"] * (10 + i)) + " explain in detail" for i in range(12)]

    def one(prompt: str) -> Any:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, prompts))
    assert all(r.usage.completion_tokens == 8 for r in responses)
    assert {r.model_extra["wattwise"]["pool"] for r in responses} == {"pool-short"}
    assert served.pool_replicas()["pool-short"] == 2
