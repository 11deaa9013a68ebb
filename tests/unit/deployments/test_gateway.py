"""The gateway over two ingress replicas in this process, one of which dies under a request
(deployments.gateway, deployments.asgi_bridge): a stream goes on from the other with no
token repeated or missing, a completion is replayed, a Batch API call is not, and when no
replica can take over the client gets an OpenAI error, never a dropped connection
(tests/ray/test_node_loss.py removes an ingress replica's machine in a real cluster)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray.exceptions import ActorDiedError
from starlette.applications import Starlette
from starlette.routing import Route

from deployments.asgi_bridge import HttpExchange, ResponseBody, ResponseParts
from deployments.gateway import Gateway, ModelRoutes, OtherApp
from deployments.ingress import Ingress
from deployments.ingress_state import IngressState
from deployments.replica import LLMReplica, ReplicaIdentity
from engines.modelled_engine import ModelledEngine, placeholder_text
from engines.modelled_engine_config import ModelledEngineConfig
from tests.in_process_app import Handle as _Handle
from tests.in_process_app import healthy as _healthy
from tests.in_process_app import sim_ingress
from tests.unit.deployments.test_ingress_app import MODEL, _auth, _config


class _Replicas:
    """Ingress replicas the gateway calls in turn; `die_after[i]` batches of body parts into
    the i-th call, that call's replica dies as one whose machine went away: the gateway's call
    fails, and nothing cancels the calls it had made to the pool replicas (they stream on
    as orphans). A replica dies `death_s` after its last batch (a machine's loss takes a
    while to be seen)."""

    def __init__(self, ingresses: list[Ingress]) -> None:
        self.ingresses = ingresses
        self.die_after: dict[int, int] = {}
        self.death_s = 0.0
        self.calls: list[HttpExchange] = []
        self.orphans: list[AsyncIterator[ResponseParts]] = []

    def start(self, http: HttpExchange) -> AsyncIterator[ResponseParts]:
        call = len(self.calls)
        self.calls.append(http)
        return self._parts(self.ingresses[call % len(self.ingresses)], http, self.die_after.get(call))

    async def _parts(self, ingress: Ingress, http: HttpExchange, die_after: int | None) -> AsyncIterator[ResponseParts]:
        if die_after == 0:
            raise ActorDiedError()
        parts, bodies = ingress.exchange(http), 0
        while True:
            try:
                batch = await parts.__anext__()
            except StopAsyncIteration:
                return
            yield batch
            bodies += any(isinstance(part, ResponseBody) for part in batch)
            if die_after is not None and bodies == die_after:
                self.orphans.append(parts)  # never closed: its pool stream goes on
                await asyncio.sleep(self.death_s)
                raise ActorDiedError()


@pytest.fixture
def replicas() -> _Replicas:
    """Built per test: the simulated engines run on the event loop of the test's client."""
    config = _config()
    engines = {p.deployment_name: LLMReplica(p.name, ModelledEngine(ModelledEngineConfig()),
                                             ReplicaIdentity("app", p.deployment_name, "r0")) for p in config.pools}
    pools: dict[str, Any] = {name: _Handle(r) for name, r in engines.items()}
    return _Replicas([Ingress(config, pools, "app", state=IngressState(config, pools, "app", pool_status=_healthy))
                      for _ in range(2)])


def _served(gateway: Gateway) -> TestClient:
    """An HTTP client of the gateway, called with each request as Serve calls it."""
    return TestClient(Starlette(routes=[Route("/{path:path}", gateway.__call__, methods=["GET", "POST"])]))


@pytest.fixture
def client(replicas: _Replicas) -> Iterator[TestClient]:
    with _served(Gateway(ModelRoutes(replicas.start, [MODEL], {}), max_body_bytes=10_000_000, failover_s=5.0)) as c:
        yield c


def _events(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_stream_whose_ingress_dies_goes_on_from_another_with_every_token_once(
        client: TestClient, replicas: _Replicas, chat: bool) -> None:
    replicas.die_after[0] = 3
    route, prompt = (("/v1/chat/completions", {"messages": [{"role": "user", "content": "tell me a story"}]}) if chat
                     else ("/v1/completions", {"prompt": "tell me a story"}))
    r = client.post(route, headers=_auth(), json={"model": MODEL, "max_tokens": 30, "stream": True, **prompt})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
    events = _events(r.text)
    deltas = [c["choices"][0]["delta"] if chat else c["choices"][0] for c in events if c.get("choices")]
    text = "".join(d.get("content" if chat else "text") or "" for d in deltas)
    request_id = events[0]["id"].removeprefix("chat").removeprefix("cmpl-")
    assert text == placeholder_text(request_id, 0, 30)  # no token missing, none repeated
    assert len({c["id"] for c in events}) == 1  # one response, as the client sees it
    if chat:
        assert [i for i, d in enumerate(deltas) if "role" in d] == [0]
    report = events[-1]["wattwise"]
    assert report["resumed"] and report["retries"] == 1
    # The continuation reached the pool replica still streaming the dead ingress's call
    # (one replica per pool here), which gave the request's id over to it.
    assert len(replicas.calls) == 2 and replicas.calls[1].resume is not None
    assert replicas.calls[1].resume.request_id == request_id and 0 < replicas.calls[1].resume.tokens < 30


def test_a_stream_whose_ingress_dies_after_the_failover_window_still_goes_on(replicas: _Replicas) -> None:
    """The window counts from the failure: a stream that ran longer than it before its
    replica died is resumed, not ended with an error (CI: a node's loss took long to be seen)."""
    replicas.die_after[0], replicas.death_s = 3, 0.6
    with _served(Gateway(ModelRoutes(replicas.start, [MODEL], {}), max_body_bytes=10_000_000, failover_s=0.3)) as c:
        r = c.post("/v1/completions", headers=_auth(),
                   json={"model": MODEL, "prompt": "tell me a story", "max_tokens": 30, "stream": True})
    events = _events(r.text)
    assert r.status_code == 200 and not any("error" in e for e in events), r.text
    assert events[-1]["wattwise"]["resumed"] and len(replicas.calls) == 2


def test_a_completion_whose_ingress_dies_before_answering_is_sent_again(
        client: TestClient, replicas: _Replicas) -> None:
    replicas.die_after[0] = 0
    r = client.post("/v1/completions", headers=_auth(), json={"model": MODEL, "prompt": "hi", "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5 and len(replicas.calls) == 2


def test_a_batch_api_call_whose_ingress_dies_is_not_sent_again(client: TestClient, replicas: _Replicas) -> None:
    replicas.die_after[0] = 0  # it may have created the batch before it died
    r = client.post("/v1/batches", headers=_auth(), json={"input_file_id": "file-x", "endpoint": "/v1/completions",
                                                          "completion_window": "24h"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "replica_failed" and len(replicas.calls) == 1


def test_a_stream_no_replica_can_take_over_ends_with_an_error_event(client: TestClient, replicas: _Replicas) -> None:
    replicas.die_after.update({0: 2, **{i: 0 for i in range(1, 200)}})  # every later call fails at once
    r = client.post("/v1/completions", headers=_auth(),
                    json={"model": MODEL, "prompt": "tell me a story", "max_tokens": 30, "stream": True})
    assert r.status_code == 200
    last = _events(r.text)[-1]
    assert last["error"]["code"] == "replica_failed" and last["error"]["type"] == "server_error"


def test_a_body_over_the_limit_is_refused_before_any_ingress_sees_it(replicas: _Replicas) -> None:
    with _served(Gateway(ModelRoutes(replicas.start, [MODEL], {}), max_body_bytes=100, failover_s=5.0)) as c:
        r = c.post("/v1/completions", headers=_auth(), content=b"x" * 1000)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large" and not replicas.calls


def test_a_request_naming_another_apps_model_goes_to_that_apps_ingress(replicas: _Replicas) -> None:
    """AppConfig.model_apps: one /v1, several models; each request reaches the app serving
    its model (asked for its names when one is not known), anything else this app's."""
    other_config = _config().model_copy(update={"model_name": "other-model"})
    other = _Replicas([sim_ingress(other_config)])
    asked: list[str] = []

    async def other_models() -> list[str]:
        asked.append("other")
        return [card["id"] for card in other.ingresses[0].model_cards()]

    routes = ModelRoutes(replicas.start, [MODEL], {"other-app": OtherApp(other.start, other_models)})
    with _served(Gateway(routes, max_body_bytes=10_000_000, failover_s=5.0)) as c:
        mine = c.post("/v1/completions", headers=_auth(), json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        theirs = c.post("/v1/chat/completions", headers=_auth(), json={
            "model": "other-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        again = c.post("/tokenize", headers=_auth(), json={"model": "other-model", "prompt": "hi"})
        unknown = c.post("/v1/completions", headers=_auth(), json={"model": "nope", "prompt": "hi"})
    assert mine.json()["model"] == MODEL and theirs.json()["model"] == "other-model", theirs.text
    assert again.status_code == 200 and asked == ["other", "other"]  # known after one ask; "nope" asks again
    assert unknown.status_code == 404 and len(replicas.calls) == 2 and len(other.calls) == 2
