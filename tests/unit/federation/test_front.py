"""The federation front door over fake clouds at the HTTP edge (httpx's MockTransport):
the OpenAI surface and its errors, placement, failover before a stream starts, resumes
after, offloading. tests/ray/test_federation.py runs it over real local clusters."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.config import hash_key
from federation.config import FederationConfig
from federation.front import FrontDoor

KEY, ADMIN = "sk-fed-tenant", "sk-fed-admin"
MODEL = "llama2-70b-sim"


class FakeCloud:
    """A wattwise app as the front sees it: /admin/load, and streamed completions whose
    events carry their tokens (app.federation_wire); `mode` says how it misbehaves."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"  # ok | down | foreign | overloaded | rate_limited | breaks | stalls
        self.outstanding_tokens = 0.0
        self.bodies: list[dict[str, Any]] = []
        self.stall = asyncio.Event()  # a stalled stream waits for this before its first event

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if self.mode == "foreign":  # another server on the cloud's address (Ray's agents answer so)
            return httpx.Response(401)
        if request.url.path == "/admin/load":
            assert request.headers["authorization"] == f"Bearer {ADMIN}-{self.name}"
            return httpx.Response(200, json={"outstanding_tokens": self.outstanding_tokens, "tokens_per_s": 0.0,
                                             "requests": 0, "running_gpus": 8, "capacity_gpus": 8, "at_s": 0.0})
        assert request.headers["x-wattwise-admin-key"] == f"{ADMIN}-{self.name}"
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.mode == "overloaded":
            return httpx.Response(503, headers={"retry-after": "30"},
                                  json={"error": {"message": "busy", "type": "overloaded", "param": None,
                                                  "code": "pool_full"}})
        if self.mode == "rate_limited":
            return httpx.Response(429, headers={"retry-after": "2"},
                                  json={"error": {"message": "slow down", "type": "requests", "param": None,
                                                  "code": "rate_limit_exceeded"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._events(body))

    async def _events(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        resume = body.get("wattwise_resume") or {}
        held = resume.get("tokens", 0)
        rid = resume.get("request_id", f"{self.name}0")
        total = body["max_tokens"]
        if self.mode == "stalls":
            await self.stall.wait()
        for i in range(held, total):
            if self.mode == "breaks" and not resume and i == 2:  # a fresh stream breaks; a resumed one goes on
                raise httpx.ReadError("the cloud went away")
            last = i == total - 1
            event: dict[str, Any] = {"id": f"cmpl-{rid}", "object": "text_completion", "model": MODEL,
                                     "choices": [{"index": 0, "text": f"t{i} ",
                                                  "finish_reason": "length" if last else None}],
                                     "wattwise_progress": {"tokens": 1}}
            if last:
                event["wattwise"] = {"cloud": self.name, "retries": resume.get("retries", -1) + 1}
            yield f"data: {json.dumps(event)}\n\n".encode()
            await asyncio.sleep(0)
        usage = {"prompt_tokens": 3, "completion_tokens": total, "total_tokens": total + 3, "energy_j": 1.0}
        yield f"data: {json.dumps({'id': f'cmpl-{rid}', 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _config(**more: Any) -> FederationConfig:
    return FederationConfig.model_validate({
        "clouds": [{"name": n, "url": f"http://{n}.test", "models": [MODEL], "admin_key": f"{ADMIN}-{n}"}
                   for n in ("east", "west")],
        "api_keys": [{"sha256": hash_key(KEY), "tenant": "acme"}],
        "admin_keys": [{"sha256": hash_key(ADMIN), "name": "ops"}],
        "load_poll_s": 0.05, "tick_s": 0.05, "failover_s": 2.0, **more})


@pytest.fixture
def clouds() -> dict[str, FakeCloud]:
    return {n: FakeCloud(n) for n in ("east", "west")}


@pytest.fixture
def front(clouds: dict[str, FakeCloud]) -> Iterator[tuple[FrontDoor, TestClient]]:
    door = FrontDoor(_config(), transports={n: c.transport() for n, c in clouds.items()})
    with TestClient(door.app()) as client:
        yield door, client


AUTH = {"authorization": f"Bearer {KEY}"}


def _complete(client: TestClient, max_tokens: int = 5, stream: bool = False) -> httpx.Response:
    return client.post("/v1/completions", headers=AUTH,
                       json={"model": MODEL, "prompt": "count for me", "max_tokens": max_tokens, "stream": stream})


def _texts(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    events = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert not any("wattwise_progress" in e for e in parsed)  # the front's own field stays with it
    return [e["choices"][0]["text"] for e in parsed if e["choices"]]


def _every_cloud(clouds: dict[str, FakeCloud], mode: str) -> None:
    for cloud in clouds.values():
        cloud.mode = mode


def _admin(client: TestClient, path: str) -> dict[str, Any]:
    return client.get(path, headers={"authorization": f"Bearer {ADMIN}"}).json()


def test_a_unary_completion_is_assembled_from_the_clouds_stream(front: tuple[FrontDoor, TestClient]) -> None:
    _, client = front
    r = _complete(client, max_tokens=4)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "t0 t1 t2 t3 "
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4
    assert body["wattwise"]["retries"] == 0
    placed = _admin(client, "/admin/clouds")
    assert sum(c["dispatched_tokens"] for c in placed.values()) > 4  # prompt + predicted output
    assert _admin(client, "/admin/requests") == {"accepted": 1, "completed": 1, "error_retryable": 0,
                                                 "error_final": 0, "cancelled": 0}


def test_bad_requests_get_the_apps_errors(front: tuple[FrontDoor, TestClient],
                                          clouds: dict[str, FakeCloud]) -> None:
    _, client = front

    def code(response: httpx.Response) -> tuple[int, str | None]:
        return response.status_code, response.json()["error"]["code"]

    assert code(client.post("/v1/completions", json={"model": MODEL, "prompt": "a"})) == (401, "invalid_api_key")
    assert code(client.post("/v1/completions", headers=AUTH, content=b"{x")) == (400, "invalid_json")
    assert client.post("/v1/completions", headers=AUTH, json={"model": MODEL}).status_code == 400
    assert code(client.post("/v1/completions", headers=AUTH, json={"model": "gpt-x", "prompt": "a"})) == (
        404, "model_not_found")
    assert code(client.post("/v1/completions", headers=AUTH, json={
        "model": MODEL, "prompt": "a", "wattwise_resume": {}})) == (403, "admin_key_required")
    assert code(client.post("/v1/completions", headers=AUTH, content=b"x" * 1_000_001)) == (413, "request_too_large")
    assert code(client.get("/admin/clouds", headers=AUTH)) == (403, "admin_key_required")
    # more than one choice's text, unary: the front cannot join it from text deltas
    unary_n = client.post("/v1/completions", headers=AUTH, json={"model": MODEL, "prompt": "a", "n": 2,
                                                                   "temperature": 1.0})
    assert code(unary_n) == (400, "unsupported_parameter") and unary_n.json()["error"]["param"] == "n"
    assert not any(c.bodies for c in clouds.values())  # none reached a cloud


def test_the_cloud_holding_fewer_tokens_gets_the_request(front: tuple[FrontDoor, TestClient],
                                                         clouds: dict[str, FakeCloud]) -> None:
    door, client = front
    clouds["east"].outstanding_tokens = 50_000  # busy with other clients' work
    _reported(door, 0, 50_000)
    for _ in range(3):
        assert _complete(client).status_code == 200
    assert (len(clouds["east"].bodies), len(clouds["west"].bodies)) == (0, 3)


@pytest.mark.parametrize("mode", ["down", "foreign", "overloaded", "rate_limited"])
def test_a_request_not_started_moves_to_another_cloud(front: tuple[FrontDoor, TestClient],
                                                      clouds: dict[str, FakeCloud], mode: str) -> None:
    door, client = front
    clouds["east"].mode = mode
    for _ in range(4):
        assert _texts(_complete(client, stream=True)) == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
    assert len(clouds["west"].bodies) == 4
    rested = not door.dispatcher.available(0, door.now_s())
    assert rested == (mode != "rate_limited")  # a 429 is the tenant's, not the cloud's: it keeps taking others


def test_a_tenant_rate_limited_everywhere_gets_the_clouds_429_at_once(front: tuple[FrontDoor, TestClient],
                                                                      clouds: dict[str, FakeCloud]) -> None:
    _, client = front
    _every_cloud(clouds, "rate_limited")
    r = _complete(client)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.headers["retry-after"] == "2"
    assert [len(c.bodies) for c in clouds.values()] == [1, 1]  # each asked once, not again until the failover ends
    assert _admin(client, "/admin/requests")["error_retryable"] == 1


def test_a_broken_stream_resumes_on_another_cloud_without_repeating_a_token(
        front: tuple[FrontDoor, TestClient], clouds: dict[str, FakeCloud]) -> None:
    _, client = front
    _every_cloud(clouds, "breaks")
    texts = _texts(_complete(client, max_tokens=6, stream=True))
    resumed = [c for c in clouds.values() if c.bodies and "wattwise_resume" in c.bodies[-1]]
    assert texts == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 ", "t5 "]
    assert len(resumed) == 1
    state = resumed[0].bodies[-1]["wattwise_resume"]
    assert (state["text"], state["tokens"], state["events"]) == ("t0 t1 ", 2, 2)
    assert state["request_id"] != resumed[0].name + "0"  # the first cloud's id goes on
    assert resumed[0].bodies[-1]["stream"] is True


def test_a_unary_request_resumes_too(front: tuple[FrontDoor, TestClient], clouds: dict[str, FakeCloud]) -> None:
    _, client = front
    _every_cloud(clouds, "breaks")
    r = _complete(client, max_tokens=4)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "t0 t1 t2 t3 "
    assert r.json()["usage"]["completion_tokens"] == 4


def test_when_no_cloud_takes_it_the_client_gets_a_retryable_503(front: tuple[FrontDoor, TestClient],
                                                                clouds: dict[str, FakeCloud]) -> None:
    _, client = front
    _every_cloud(clouds, "down")
    r = _complete(client)
    assert r.status_code == 503 and r.json()["error"]["code"] == "clouds_unavailable"
    assert int(r.headers["retry-after"]) >= 1
    assert client.get("/health/ready").status_code == 503
    assert _admin(client, "/admin/requests")["error_retryable"] == 1


def _reported(door: FrontDoor, cloud: int, tokens: float) -> None:
    """Wait for the front's next poll to bring a cloud's report."""
    while abs(door.dispatcher.status(cloud, door.now_s()).foreign_tokens - tokens) > 1:
        time.sleep(0.02)


def test_an_idle_cloud_takes_a_request_that_has_not_started_elsewhere(
        front: tuple[FrontDoor, TestClient], clouds: dict[str, FakeCloud]) -> None:
    """Mico's back-off: east has 50,000 tokens of other clients' work ahead of our request;
    west drains: it takes the request, which starts sooner there."""
    door, client = front
    east, west = clouds["east"], clouds["west"]
    east.outstanding_tokens = 50_000
    _reported(door, 0, 50_000)
    assert _complete(client, max_tokens=40).status_code == 200  # on west: its throughput is measured
    assert len(west.bodies) == 1
    west.outstanding_tokens, east.mode = 60_000, "stalls"
    _reported(door, 1, 60_000)
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(_complete, client, 3)
        while not east.bodies:  # placed on east, the less busy
            time.sleep(0.02)
        west.outstanding_tokens = 0.0  # west drained
        r = sent.result(timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "t0 t1 t2 "
    assert len(west.bodies) == 2 and "wattwise_resume" not in west.bodies[-1]
    assert b'wattwise_federation_offloads_total{from_cloud="east",to_cloud="west"} 1.0' in client.get(
        "/metrics").content
