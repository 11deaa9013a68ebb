"""The federation front door: one OpenAI endpoint over N wattwise apps (clouds).

Each request is checked as an app checks it (the same keys, schemas and errors), costed
in predicted tokens (the app's prompt counter and Mico's length predictor) and placed by
the CloudDispatcher, the object the simulator's multi-cluster runs place queries with
(app.cloud_dispatch); federation.relay carries it to a cloud and over failures. Two loops
feed the dispatcher: each cloud's GET /admin/load (its work from other clients, its
capacity), and a tick that measures the clouds' progress and hands not-started requests
to an idle cloud. /metrics has the per-cloud metrics, /admin/clouds what the dispatcher
sees, /admin/requests the accepted requests' outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from app.auth import Authenticator
from app.cloud_dispatch import BackOffSettings, CloudDispatcher
from app.federation_wire import RESUME_FIELD
from app.grid_signal import HourlyGridSignal
from app.http_io import error_response, read_limited_body
from app.openai_api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    invalid_request,
)
from core.classes import LengthClassConfig
from core.token_counter import default_token_counter
from federation.config import FederationConfig
from federation.metrics import FrontMetrics
from federation.relay import CloudAnswer, Relay, RequestShape
from federation.unary import chat_body, completion_body, unassemblable
from federation.upstream import CloudClient, Unreachable
from prediction.predictor_config import PredictorConfig
from prediction.predictor_factory import make_predictor

logger = logging.getLogger("wattwise.federation")
ROUTE_COMPLETIONS = "/v1/completions"
ROUTE_CHAT = "/v1/chat/completions"
SERVICE_CLASS_HEADER = "x-service-class"


def _completion_text(event: dict[str, Any]) -> str:
    return str(event["choices"][0].get("text") or "")


def _chat_text(event: dict[str, Any]) -> str:
    return str((event["choices"][0].get("delta") or event["choices"][0].get("message") or {}).get("content") or "")


ROUTES: dict[str, tuple[type[CompletionRequest] | type[ChatCompletionRequest], Callable[[Any], str],
                        Callable[[dict[str, Any]], str], Callable[..., dict]]] = {
    ROUTE_COMPLETIONS: (CompletionRequest, lambda b: b.prompt, _completion_text, completion_body),
    ROUTE_CHAT: (ChatCompletionRequest, lambda b: b.prompt_text(), _chat_text, chat_body),
}


class FrontDoor:
    def __init__(self, config: FederationConfig, transports: Mapping[str, httpx.AsyncBaseTransport] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`transports`: by cloud name, a test's fake at the HTTP edge; `clock`: the
        dispatcher's time (monotonic seconds)."""
        self.config = config
        self.clouds = [CloudClient(c, config.connect_timeout_s, (transports or {}).get(c.name)) for c in config.clouds]
        self.dispatcher = CloudDispatcher(
            len(self.clouds), [c.capacity_gpus for c in config.clouds],
            BackOffSettings(below=config.back_off_below, carbon_weight=config.carbon_weight))
        self.metrics = FrontMetrics([c.name for c in config.clouds])
        self.auth = Authenticator(config.api_keys, config.admin_keys, config.default_service_class)
        self.failover_s = config.failover_s
        self.relays: dict[str, Relay] = {}
        self.signal = HourlyGridSignal.from_config(config.grid) if config.grid is not None else None
        self.counter = default_token_counter()
        self.predictor = make_predictor(PredictorConfig(online_sample_rate=0.0), LengthClassConfig(),
                                        config.default_max_tokens)
        self._clock = clock
        self._loops: list[asyncio.Task] = []

    def now_s(self) -> float:
        return self._clock()

    def intensity(self) -> dict[int, float] | None:
        """Each cloud's grid carbon intensity now, for carbon_weight (None: not weighed)."""
        if self.signal is None or self.config.carbon_weight <= 0:
            return None
        now = time.time()
        return {k: self.signal.at(c.region, now).carbon_g_per_kwh for k, c in enumerate(self.config.clouds)
                if c.region is not None}

    # ---- the loops that feed the dispatcher ---------------------------------------------
    async def poll_loads(self) -> None:
        """Each cloud's own report, every `load_poll_s`; one that does not answer rests."""
        while True:
            reports = await asyncio.gather(*(c.load() for c in self.clouds), return_exceptions=True)
            now = self.now_s()
            for k, report in enumerate(reports):
                if isinstance(report, Unreachable):
                    if self.dispatcher.available(k, now):
                        logger.warning("cloud %s: load unreadable (%s)", self.clouds[k].name, report)
                        self.dispatcher.failed(k, now)
                elif isinstance(report, BaseException):
                    raise report
                else:  # it answers: its rests start again from the shortest
                    self.dispatcher.report(k, report, now)
                    self.dispatcher.succeeded(k)
            await asyncio.sleep(self.config.load_poll_s)

    async def tick(self) -> None:
        """Measure the clouds' progress; move not-started requests to an idle cloud (Mico)."""
        while True:
            now = self.now_s()
            self.dispatcher.tick(now)
            if self.config.offload:
                for move in self.dispatcher.offloads(now):
                    relay = self.relays.get(move.request_id)
                    if relay is not None and relay.move_to(move.to_cluster):
                        self.metrics.offloads.labels(self.clouds[move.from_cluster].name,
                                                     self.clouds[move.to_cluster].name).inc()
            self.metrics.clouds({c.name: self.dispatcher.status(k, now) for k, c in enumerate(self.clouds)})
            await asyncio.sleep(self.config.tick_s)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The loops, for the app's life."""
        self._loops = [asyncio.create_task(self.poll_loads()), asyncio.create_task(self.tick())]
        try:
            yield
        finally:
            for task in self._loops:
                task.cancel()
            await asyncio.gather(*self._loops, return_exceptions=True)
            await asyncio.gather(*(c.close() for c in self.clouds))

    # ---- the request path -------------------------------------------------------------------
    async def complete(self, http: HTTPRequest, route: str) -> Response:
        schema, prompt_of, text_of, render = ROUTES[route]
        try:
            tenant = self.auth.tenant(http.headers.get("authorization"), http.headers.get(SERVICE_CLASS_HEADER))
            data = _json_object(await read_limited_body(http, self.config.max_request_bytes))
            try:
                body: Any = schema.model_validate(data)
            except ValidationError as exc:
                raise invalid_request(exc) from None
            if RESUME_FIELD in data:
                raise APIError(403, f"'{RESUME_FIELD}' is the front door's own field.", "permission_error",
                               param=RESUME_FIELD, code="admin_key_required")
            if not body.stream and (name := unassemblable(body)) is not None:
                raise APIError(400, f"'{name}' needs a streamed request through the federation front (it joins "
                               "one choice's text for a unary one), or the cloud's own endpoint.", param=name,
                               code="unsupported_parameter")
            if body.model not in self.config.models:
                raise APIError(404, f"The model '{body.model}' does not exist. Available: {self.config.models}.",
                               param="model", code="model_not_found")
        except APIError as err:
            return error_response(err)
        prompt = prompt_of(body)
        prompt_tokens = self.counter.count(prompt)
        max_tokens = getattr(body, "requested_max_tokens", body.max_tokens) or self.config.default_max_tokens
        predicted = self.predictor.predict(prompt_tokens, max_tokens, prompt)
        relay = Relay(self, RequestShape(route, data, dict(http.headers), tenant.service_class, body.model,
                                         float(prompt_tokens + predicted), prompt_tokens, text_of))
        self.metrics.accepted()
        events = relay.events()
        try:
            first = await anext(events)
        except (APIError, CloudAnswer) as failed:
            return self._failed(failed)
        except asyncio.CancelledError:
            self.metrics.outcome("cancelled")
            raise
        if body.stream:
            return StreamingResponse(self._sse(first, events), media_type="text/event-stream")
        return await self._whole(first, events, body.model, render, text_of)

    def _failed(self, failed: APIError | CloudAnswer) -> Response:
        if isinstance(failed, APIError):
            self.metrics.outcome("error_retryable" if failed.retry_after_s is not None else "error_final")
            return error_response(failed)
        refused = failed.refused
        self.metrics.outcome("error_retryable" if refused.status in (429, 503) else "error_final")
        headers = {"Retry-After": str(max(1, round(refused.retry_after_s)))} if refused.retry_after_s else {}
        return Response(refused.body, status_code=refused.status, headers=headers, media_type="application/json")

    async def _sse(self, first: dict[str, Any], events: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[str]:
        """The events as SSE; a failure past the failover ends the stream with an error event."""
        outcome = "completed"
        try:
            event: dict[str, Any] | None = first
            while event is not None:
                if "error" in event:
                    outcome = "error_final"
                yield f"data: {json.dumps(event)}\n\n"
                event = await anext(events, None)
            if outcome == "completed":
                yield "data: [DONE]\n\n"
        except APIError as err:
            outcome = "error_retryable"
            yield f"data: {json.dumps(err.body())}\n\n"
        except CloudAnswer as answer:  # a resume the next cloud refused
            outcome = "error_final"
            yield f"data: {answer.refused.body.decode(errors='replace')}\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            await events.aclose()
            self.metrics.outcome(outcome)

    async def _whole(self, first: dict[str, Any], events: AsyncGenerator[dict[str, Any], None], model: str,
                     render: Callable[..., dict], text_of: Callable[[dict[str, Any]], str]) -> Response:
        """A unary response assembled from the stream the cloud sent."""
        text: list[str] = []
        finish = usage = report = rid = None
        try:
            event: dict[str, Any] | None = first
            while event is not None:
                if "error" in event:
                    self.metrics.outcome("error_final")
                    return JSONResponse(event, status_code=500)
                rid = rid or event.get("id")
                if event.get("choices"):
                    text.append(text_of(event))
                    finish = event["choices"][0].get("finish_reason") or finish
                usage = event.get("usage") or usage
                report = event.get("wattwise") or report
                event = await anext(events, None)
        except (APIError, CloudAnswer) as failed:
            return self._failed(failed)
        except asyncio.CancelledError:
            self.metrics.outcome("cancelled")
            raise
        finally:
            await events.aclose()
        self.metrics.outcome("completed")
        body = render(rid, model, "".join(text), finish, usage)
        body["wattwise"] = report
        return JSONResponse(body)

    # ---- the app --------------------------------------------------------------------------
    def app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            async with self.running():
                yield

        app = FastAPI(title="wattwise federation", description="One OpenAI endpoint over several wattwise apps.",
                      lifespan=lifespan)

        async def completions(http: HTTPRequest) -> Response:
            return await self.complete(http, ROUTE_COMPLETIONS)

        async def chat_completions(http: HTTPRequest) -> Response:
            return await self.complete(http, ROUTE_CHAT)

        app.add_api_route(ROUTE_COMPLETIONS, completions, methods=["POST"])
        app.add_api_route(ROUTE_CHAT, chat_completions, methods=["POST"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/health/ready", self.ready, methods=["GET"])
        app.add_api_route("/admin/clouds", self.admin_clouds, methods=["GET"])
        app.add_api_route("/admin/requests", self.admin_requests, methods=["GET"])
        app.add_api_route("/metrics", self.prometheus, methods=["GET"])
        return app

    async def models(self, http: HTTPRequest) -> Response:
        try:
            self.auth.tenant(http.headers.get("authorization"), http.headers.get(SERVICE_CLASS_HEADER))
        except APIError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "wattwise"} for m in self.config.models]})

    async def ready(self) -> Response:
        """200 while some cloud takes requests."""
        now = self.now_s()
        clouds = {c.name: self.dispatcher.available(k, now) for k, c in enumerate(self.clouds)}
        ready = any(clouds.values())
        return JSONResponse({"ready": ready, "clouds": clouds}, status_code=200 if ready else 503)

    async def admin_clouds(self, http: HTTPRequest) -> Response:
        """Each cloud as the dispatcher sees it: outstanding and placed predicted tokens,
        capacity, speed (the back-off), whether it takes requests."""
        try:
            self.auth.admin(http.headers.get("authorization"))
        except APIError as err:
            return error_response(err)
        now = self.now_s()
        return JSONResponse({c.name: {"url": c.config.url, "models": c.config.models, "region": c.config.region,
                                      **dataclasses.asdict(self.dispatcher.status(k, now))}
                             for k, c in enumerate(self.clouds)})

    async def admin_requests(self, http: HTTPRequest) -> Response:
        """Accepted requests and their outcomes: each accepted one ends in exactly one."""
        try:
            self.auth.admin(http.headers.get("authorization"))
        except APIError as err:
            return error_response(err)
        return JSONResponse(dict(self.metrics.counts))

    async def prometheus(self) -> Response:
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4")


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "Request body must be a JSON object.", code="invalid_json")
    return data

