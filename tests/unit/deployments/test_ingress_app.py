"""The ingress and its replicas constructed directly, without Ray or Serve: the HTTP app
(OpenAI, admin and Batch API routers over the ingress state, one APIError handler) over
pool "handles" that call LLMReplica objects running the simulated engine in process, so
the typed replica messages cross the same boundary as in Serve (tests/ray/test_serve.py
covers the deployed app)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from app.config import AppConfig, hash_key
from core.paths import SERVE_CONFIG
from core.published_plan import PublishedPlan
from deployments.ingress import Ingress, pool_ready
from deployments.messages import Prefilled, ReplicaChunk, Shed, SplitwiseReport, Squashed
from deployments.replica import LLMReplica
from engines.protocol import RequestUsage
from tests.in_process_app import Handle as _Handle
from tests.in_process_app import sim_ingress

KEY, ADMIN_KEY = "sk-unit-tenant", "sk-unit-admin"
MODEL = "llama2-70b-sim"


class _Shedding:
    """A replica that refuses every request, as an overloaded one does."""

    async def complete(self, request: Any) -> Shed:
        return Shed("queue full", 2.0)


def _config() -> AppConfig:
    args = yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]
    args["api_keys"] = [{"sha256": hash_key(KEY), "tenant": "acme", "service_class": "interactive"}]
    args["admin_keys"] = [{"sha256": hash_key(ADMIN_KEY), "name": "unit"}]
    return AppConfig.model_validate(args).resolved()


@pytest.fixture(scope="module")
def ingress() -> Ingress:
    """Built once (the predictor and the engines' models take seconds to load)."""
    return sim_ingress(_config())


@pytest.fixture
def client(ingress: Ingress) -> Iterator[TestClient]:
    pools = dict(ingress.pools)
    with TestClient(ingress.http_app()) as c:
        yield c
    ingress.pools.update(pools)


def _auth(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _error(response: Any, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


def test_a_completion_is_served_from_the_replicas_typed_reply(client: TestClient) -> None:
    r = client.post("/v1/completions", headers=_auth(), json={"model": MODEL, "prompt": "hello there", "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["text"]
    assert body["wattwise"]["service_class"] == "interactive" and body["wattwise"]["retries"] == 0


def test_a_stream_ends_with_usage_and_done(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", headers=_auth(), json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert any("wattwise" in c for c in chunks)


def test_errors_keep_openais_format_and_status(client: TestClient) -> None:
    _error(client.get("/v1/models"), 401, "invalid_api_key")
    assert client.get("/v1/models", headers=_auth()).json()["data"][0]["id"] == MODEL
    _error(client.post("/v1/completions", headers=_auth(), content=b"{nope"), 400, "invalid_json")
    _error(client.post("/v1/completions", headers=_auth(), json={"model": "gpt-x", "prompt": "a"}), 404,
           "model_not_found")
    _error(client.get("/admin/requests"), 401, "invalid_api_key")
    _error(client.get("/admin/requests", headers=_auth()), 403, "admin_key_required")
    assert client.get("/admin/requests", headers=_auth(ADMIN_KEY)).status_code == 200
    _error(client.post("/admin/drain", headers=_auth(ADMIN_KEY), json={"pool": "nope"}), 404, "pool_not_found")
    _error(client.get("/admin/splitwise", headers=_auth(ADMIN_KEY)), 404, "not_found")
    _error(client.post("/v1/batches", headers=_auth(), json={}), 404, "batch_api_disabled")
    assert client.get("/health/ready").status_code == 200


def test_a_refusal_is_a_503_with_retry_after(client: TestClient, ingress: Ingress) -> None:
    for name in ingress.pools:
        ingress.pools[name] = _Handle(_Shedding())  # type: ignore[assignment]
    r = client.post("/v1/completions", headers=_auth(), json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
    error = _error(r, 503, "pool_full")
    assert "queue full" in error["message"] and r.headers["retry-after"] == "2"


def test_every_batch_api_line_is_counted_accepted_and_ends_in_one_outcome(client: TestClient, ingress: Ingress) -> None:
    """The invariant /admin/requests and the fault tests check (accepted == sum of outcomes)
    holds for the Batch API queue's lines as for HTTP requests: served or refused."""
    def counts() -> dict[str, int]:
        return client.get("/admin/requests", headers=_auth(ADMIN_KEY)).json()

    line = {"model": MODEL, "prompt": "summarise this", "max_tokens": 3}
    before = counts()
    ok, response = client.portal.call(ingress.run_batch_request, line, 0.0)  # type: ignore[union-attr]
    assert ok and response["usage"]["completion_tokens"] == 3
    for name in ingress.pools:
        ingress.pools[name] = _Handle(_Shedding())  # type: ignore[assignment]
    ok, error = client.portal.call(ingress.run_batch_request, line, 0.0)  # type: ignore[union-attr]
    assert not ok and error["code"] == "pool_full"
    after = counts()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"accepted": 2, "retries": 0, "completed": 1, "error_retryable": 1, "error_final": 0,
                     "cancelled": 0}


class _BackedUp:
    """A replica with more prompt tokens to prefill than any overflow limit: it refuses a
    request its router may send elsewhere (as the batcher's RequestOverflowed does), and
    serves one it may not."""

    def __init__(self, replica: LLMReplica) -> None:
        self.replica = replica
        self.limits: list[int | None] = []

    async def complete(self, request: Any) -> Any:
        self.limits.append(request.refuse_above_pending_tokens)
        if request.refuse_above_pending_tokens is not None:
            return Shed("backed up", 0.0)
        return await self.replica.complete(request)


def test_a_backed_up_pool_overflows_to_another_serving_pool_in_order(client: TestClient, ingress: Ingress) -> None:
    """app.pool_overflow through the ingress: the short pool's replica refuses, the next
    serving pool with a replica running serves; with no plan's routing yet (no pool known to
    serve), no overflow."""
    short = ingress.pools["pool-short"]
    backed_up = _BackedUp(short.target)  # type: ignore[attr-defined]
    ingress.pools["pool-short"] = _Handle(backed_up)  # type: ignore[assignment]
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 3}
    try:
        first = client.post("/v1/completions", headers=_auth(), json=body)
        assert first.status_code == 200 and first.json()["wattwise"]["pool"] == "pool-short"
        assert backed_up.limits == [None]
        own = {c: {p.deployment_name: 1.0} for p in ingress.config.pools for c in p.classes}
        ingress.router.set_weights(own)
        r = client.post("/v1/completions", headers=_auth(), json=body)
        assert r.status_code == 200, r.text
        others = [p.deployment_name for p in ingress.config.pools if p.deployment_name != "pool-short"]
        assert r.json()["wattwise"]["pool"] == others[0]
        assert backed_up.limits[1:] == [ingress.config.pool_overflow.backed_up_tokens]
        # The controller's plan counts no replica running in that pool (folded, or starting):
        # the request overflows past it to the one after.
        ingress.apply_plan(PublishedPlan(routing_weights=own, running_replicas={others[0]: 0}))
        r = client.post("/v1/completions", headers=_auth(), json=body)
        assert r.status_code == 200, r.text
        assert r.json()["wattwise"]["pool"] == others[1]
    finally:
        ingress.apply_plan(PublishedPlan())


def test_replica_messages_pickle() -> None:
    usage = RequestUsage(3, 2, 1.5, 0.1, 0.3, 0.2, 0)
    for message in (ReplicaChunk("ab", 2, "stop", usage, splitwise=SplitwiseReport("p", "prompt", "t", "token", 9)),
                    Squashed(4.0), Shed("queue full", 1.0), Prefilled(ReplicaChunk("a", 1), None, "r0")):
        assert pickle.loads(pickle.dumps(message)) == message


def test_a_pool_is_ready_while_it_serves_not_while_it_fails_or_first_deploys() -> None:
    def status(name: str, running: int = 1) -> dict[str, Any]:
        return {"status": name, "replicas": {"RUNNING": running}}

    assert all(pool_ready(status(s)) for s in ("HEALTHY", "UPSCALING", "DOWNSCALING"))  # the controller resizes
    assert pool_ready(status("HEALTHY", running=0))  # folded into another pool: routed around
    assert pool_ready(status("UPDATING")) and not pool_ready(status("UPDATING", running=0))  # rolling vs first
    assert not any(pool_ready(status(s)) for s in ("UNHEALTHY", "DEPLOY_FAILED"))
    assert not pool_ready({})  # Serve does not know the pool


def _stream_events(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    events = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_federation_front_gets_each_events_tokens_and_a_wrong_key_is_refused(client: TestClient) -> None:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 6, "stream": True}
    plain = _stream_events(client.post("/v1/completions", headers=_auth(), json=body))
    assert not any("wattwise_progress" in e for e in plain)  # a client of the app sees OpenAI's stream
    federated = _stream_events(client.post("/v1/completions", headers={**_auth(), "x-wattwise-admin-key": ADMIN_KEY},
                                           json=body))
    assert sum(e["wattwise_progress"]["tokens"] for e in federated) == 6
    _error(client.post("/v1/completions", headers={**_auth(), "x-wattwise-admin-key": KEY}, json=body), 403,
           "admin_key_required")


def test_a_stream_begun_on_another_cloud_goes_on_from_what_its_client_holds(client: TestClient) -> None:
    held = {"request_id": "abc123", "arrival_s": 1000.0, "text": "one two", "tokens": 2, "first_token_s": 1000.5,
            "last_token_s": 1001.0, "events": 2}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, "wattwise_resume": held}
    events = _stream_events(client.post("/v1/chat/completions",
                                        headers={**_auth(), "x-wattwise-admin-key": ADMIN_KEY}, json=body))
    assert {e["id"] for e in events} == {"chatcmpl-abc123"}  # a chat stream's id, as vLLM names it
    assert "role" not in events[0]["choices"][0]["delta"]  # the client had its role already
    assert sum(e["wattwise_progress"]["tokens"] for e in events if "wattwise_progress" in e) == 4  # the rest only
    report = next(e["wattwise"] for e in events if "wattwise" in e)
    assert report["resumed"] and report["retries"] == 1
    assert events[-1]["usage"]["completion_tokens"] == 6  # every token the client got
    _error(client.post("/v1/chat/completions", headers=_auth(), json=body), 403, "admin_key_required")
    _error(client.post("/v1/chat/completions", headers={**_auth(), "x-wattwise-admin-key": ADMIN_KEY},
                       json={**body, "stream": False}), 400, None)
    _error(client.post("/v1/chat/completions", headers={**_auth(), "x-wattwise-admin-key": ADMIN_KEY},
                       json={**body, "wattwise_resume": {**held, "tokens": -1}}), 400, None)


def test_the_gateway_learns_the_prefix_of_a_stream_a_federation_front_resumed(client: TestClient,
                                                                               ingress: Ingress) -> None:
    """Through the gateway's bridge: its first part reports what the client held before this
    app took the stream over, so that an ingress failure later resumes the whole of it."""
    from deployments.asgi_bridge import HttpExchange, ResponseBody

    held = {"request_id": "fed42", "arrival_s": 1000.0, "text": "one two", "tokens": 2, "events": 2}
    body = {"model": MODEL, "prompt": "count", "max_tokens": 5, "stream": True, "wattwise_resume": held}
    exchange = HttpExchange("POST", "/v1/completions", "", b"", (
        (b"authorization", f"Bearer {KEY}".encode()), (b"x-wattwise-admin-key", ADMIN_KEY.encode()),
        (b"content-type", b"application/json")), json.dumps(body).encode())

    async def parts() -> list[Any]:
        return [part async for batch in ingress.exchange(exchange) for part in batch]

    progress = [p.progress for p in client.portal.call(parts) if isinstance(p, ResponseBody) and p.progress]  # type: ignore[union-attr]
    assert progress[0].text.startswith("one two") and progress[0].request_id == "fed42"
    assert sum(p.tokens for p in progress) == 5  # the two held, then the three generated here
