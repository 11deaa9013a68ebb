"""The HTTP entry on the head node: every request goes to an ingress replica through it,
so losing an ingress replica's machine loses no stream.

An ingress replica holds what its streams have sent; if its machine dies, a load
balancer in front of it (HAProxy, Serve's proxy) can only drop those connections. The
gateway holds the client's connection instead and hands the request to an ingress
replica (deployments.asgi_bridge), tracking what the client already holds of a streamed
completion. When the replica fails, it asks another to finish the stream from there:
the client sees one stream, a pause, no token repeated or missing. Before anything was
sent, a completion is simply sent again; other requests (Batch API, admin) may have
taken effect, so their failure is answered with a retryable 503. Past `failover_s` of
failed attempts (counted from the failure, not from the request's start: a stream may
run for minutes before its replica dies) the stream ends with an OpenAI error event,
never a dropped connection.

It runs on the head node (`HEAD_NODE_RESOURCE_NAME`): the one machine whose loss ends
a Ray cluster anyway (its GCS), and where a single-address load balancer sits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse

from app.http_io import error_response, read_limited_body
from app.openai_api import APIError
from deployments.asgi_bridge import HttpExchange, ResponseBody, ResponsePart, ResponseStart, StreamState
from deployments.metrics import GatewayMetrics

logger = logging.getLogger("ray.serve")

COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions")

# Calls an ingress replica: the exchange's response, in batches of parts.
StartExchange = Callable[[HttpExchange], Any]


def _replica_failed(exc: BaseException) -> APIError:
    return APIError(503, f"The ingress replica serving this request failed ({type(exc).__name__}) and no other "
                    "took it over; retry.", "server_error", code="replica_failed", retry_after_s=1)


def is_failover(exc: BaseException) -> bool:
    """The ingress replica died or cannot take the call: worth another replica. An
    exception raised inside the replica (a bug) would fail again and is not."""
    return isinstance(exc, (RayActorError, BackPressureError))


def replayable(exchange: HttpExchange) -> bool:
    """A request that may be sent again if its replica failed before answering: reads,
    and completions (a failed one had no effect the client saw)."""
    return exchange.method in ("GET", "HEAD") or exchange.path.endswith(COMPLETION_ROUTES)


def _sse_event(body: bytes) -> bytes:
    return b"data: " + body.strip() + b"\n\n"


class ExchangeRelay:
    """One request's response, from whichever ingress replica serves it."""

    def __init__(self, start: StartExchange, exchange: HttpExchange, failover_s: float,
                 metrics: GatewayMetrics | None = None) -> None:
        self.start, self.exchange, self.failover_s, self.metrics = start, exchange, failover_s, metrics
        self._failing_since_s: float | None = None  # the first failed attempt since a replica last answered
        self.state: StreamState | None = None  # what the client holds of a streamed completion
        self._batches: Any = None  # the call to the replica now answering
        self._pending: deque[ResponsePart] = deque()  # parts of its last batch not yet relayed
        self._attempt = 0

    async def response(self) -> Response:
        """The response to send: streamed through for SSE, whole otherwise."""
        try:
            head = await self._open(self.exchange)
            if head.is_stream and head.status == 200:
                response: Response = StreamingResponse(self._stream(), status_code=head.status)
            else:
                head, body = await self._whole(head)
                response = Response(body, status_code=head.status)
        except asyncio.CancelledError:  # the client left: so does the replica's call
            self._cancel()
            raise
        except Exception as exc:
            if not is_failover(exc):
                raise
            self._count("failed")
            return error_response(_replica_failed(exc))
        response.raw_headers = list(head.headers)
        return response

    async def _open(self, exchange: HttpExchange) -> ResponseStart:
        """The response's start from the first replica that answers; a replica that fails
        first is replaced, for a request that may be replayed, until `failover_s`."""
        while True:
            self._cancel()
            self._batches, self._pending = self.start(exchange), deque()
            try:
                part = await self._next()
            except Exception as exc:
                await self._back_off(exc, replayable(exchange))
                self._count("replayed" if exchange.resume is None else "resumed")
                continue
            assert isinstance(part, ResponseStart), part
            return part

    async def _whole(self, head: ResponseStart) -> tuple[ResponseStart, bytes]:
        """A response that is not a stream, read whole (so it can be replayed whole if the
        replica fails midway)."""
        while True:
            try:
                return head, await self._rest()
            except Exception as exc:
                await self._back_off(exc, replayable(self.exchange))
                self._count("replayed")
                head = await self._open(self.exchange)

    async def _stream(self) -> AsyncIterator[bytes]:
        """SSE events as they come; a failed replica's stream goes on from another."""
        try:
            while True:
                try:
                    part = await self._next()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    error = await self._resume(exc)
                    if error is not None:
                        yield error
                        return
                    continue
                if isinstance(part, ResponseBody) and part.progress is not None:
                    self.state = part.progress.state() if self.state is None else self.state.after(part.progress)
                yield self._body_of(part)
        finally:
            self._cancel()

    async def _resume(self, exc: BaseException) -> bytes | None:
        """Start the rest of the stream on another replica; an SSE error event to end the
        stream with instead if that cannot be done."""
        try:
            await self._back_off(exc, True)
            self._count("resumed" if self.state is not None else "replayed")
            head = await self._open(dataclasses.replace(self.exchange, resume=self.state))
        except Exception as failed:
            self._count("failed")
            return _sse_event(json.dumps(_replica_failed(failed).body()).encode())
        if head.status != 200 or not head.is_stream:  # the continuation was refused: its error, as an event
            return _sse_event(await self._rest())
        return None

    async def _back_off(self, exc: BaseException, may_retry: bool) -> None:
        """Wait before the next attempt, or raise `exc` if there is to be none: Serve's
        router may pick the dead replica until it learns of its death."""
        now_s = time.monotonic()
        if self._failing_since_s is None:
            self._failing_since_s, self._attempt = now_s, 0
        deadline_s = self._failing_since_s + self.failover_s
        if not (may_retry and is_failover(exc)) or now_s >= deadline_s:
            raise exc
        await asyncio.sleep(min(0.1 * 2 ** self._attempt, 1.0, deadline_s - now_s))
        self._attempt += 1

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.failover(outcome)

    async def _next(self) -> ResponsePart:
        """The replica's next part (StopAsyncIteration after the last)."""
        while not self._pending:
            self._pending.extend(await self._batches.__anext__())
            self._failing_since_s = None  # a replica answers: a later failure has a failover window of its own
        return self._pending.popleft()

    async def _rest(self) -> bytes:
        """The rest of the body."""
        body = []
        while True:
            try:
                body.append(self._body_of(await self._next()))
            except StopAsyncIteration:
                return b"".join(body)

    @staticmethod
    def _body_of(part: ResponsePart) -> bytes:
        assert isinstance(part, ResponseBody), part
        return part.body

    def _cancel(self) -> None:
        cancel = getattr(self._batches, "cancel", None)
        if cancel is not None:
            cancel()


# The routes whose body names a model another app may serve (AppConfig.model_apps).
MODEL_ROUTES = (*COMPLETION_ROUTES, "/tokenize", "/detokenize")


@dataclasses.dataclass(frozen=True)
class OtherApp:
    """An app whose models this app's /v1 serves too: its ingress and the names it serves."""

    start: StartExchange
    models: Callable[[], Awaitable[list[str]]]


class ModelRoutes:
    """Which app's ingress takes a request: the one serving the model its body names, this
    app's own unless another app serves it (AppConfig.model_apps). Other apps' models are
    asked for when a name is not known yet, so an adapter added there is found."""

    def __init__(self, own: StartExchange, own_models: list[str], others: dict[str, OtherApp]) -> None:
        self.own, self.own_models, self.others = own, set(own_models), others
        self._app_of: dict[str, str] = {}  # another app's model -> that app

    async def start_for(self, exchange: HttpExchange) -> StartExchange:
        if not self.others or exchange.method != "POST" or not exchange.path.endswith(MODEL_ROUTES):
            return self.own
        try:
            model = json.loads(exchange.body).get("model")
        except (ValueError, AttributeError):
            return self.own  # the ingress answers the bad body
        if model in self.own_models or not isinstance(model, str):
            return self.own
        if model not in self._app_of:
            for app, entry in self.others.items():
                try:
                    self._app_of.update(dict.fromkeys(await entry.models(), app))
                except Exception:  # not deployed (yet), or failing: its models are not served now
                    logger.warning("wattwise gateway: app %r did not list its models", app, exc_info=True)
        other = self._app_of.get(model)
        return self.own if other is None else self.others[other].start  # unknown: this app's 404


class Gateway:
    """Relays each HTTP request to the ingress deployment serving its model (`routes`
    picks it; `start` calls one of its replicas) and survives the replica's failure (see
    the module docstring)."""

    def __init__(self, routes: ModelRoutes, max_body_bytes: int, failover_s: float,
                 metrics: GatewayMetrics | None = None) -> None:
        self.routes, self.max_body_bytes, self.failover_s, self.metrics = routes, max_body_bytes, failover_s, metrics

    async def __call__(self, http: HTTPRequest) -> Response:
        try:
            body = await read_limited_body(http, self.max_body_bytes)
        except APIError as err:
            return error_response(err)
        exchange = HttpExchange.of(http.scope, body)
        relay = ExchangeRelay(await self.routes.start_for(exchange), exchange, self.failover_s, self.metrics)
        return await relay.response()
