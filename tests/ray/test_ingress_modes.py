"""The ingress modes other than the default (wattwise/ingress_mode.py; every other Ray test
runs HAProxy) must keep what clients rely on: bearer-token auth, SSE streaming, OpenAI-format
4xx with their headers and our Prometheus metrics, over real HTTP. Serve's proxy is the
fallback (WATTWISE_INGRESS=proxy); direct ingress is measured by `wattwise bench ingress`
(docs/operations.md, "Serve's fast path") but not offered: it does not balance."""

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.factories import INTERACTIVE_KEY, LIMITED_KEY, quick_config
from tests.live_app import metric_sum, wait_for
from wattwise.ingress_mode import IngressMode
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServe]:
    with LocalServe(edit=quick_config, ingress=IngressMode.PROXY, dashboard=False) as local:
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
