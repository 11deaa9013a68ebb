"""An ingress replica's HTTP app, served over a Ray handle so a stream can move between replicas.

The gateway (deployments.gateway) takes each HTTP request and hands it to an ingress
replica as an `HttpExchange`; the replica runs its own FastAPI app on it (`run_exchange`)
and streams back a `ResponseStart` and `ResponseBody` parts. Each part of a streamed
completion carries `StreamProgress`, what it added to the client's response, so the
gateway always knows what its client holds (`StreamState`) and, if the replica dies, asks
another to finish the stream from there. The ingress's routes read the state they resume
from, and publish their stream's progress, through `current_exchange()`.

Contract: an exchange yields one `ResponseStart`, then `ResponseBody` parts, the last with
`more_body=False`, unless the replica dies; an app error before the response starts
becomes a 500 in OpenAI's error format. Parts travel in batches, everything the app sent
since the last batch (each batch is one Ray object: a unary response is one, and the last
events of a stream go together).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from app.federation_wire import HeldStream
from app.openai_api import APIError
from deployments.resume import Progress, ResumableStream, Resumption

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


@dataclass(frozen=True)
class StreamState(HeldStream):
    """The gateway's view of what its client holds (app.federation_wire.HeldStream), and how
    it moves as body parts go out."""

    def progress(self) -> Progress:
        return Progress(self.arrival_s, [self.text] if self.text else [], self.tokens, self.first_token_s,
                        self.last_token_s)

    def resumption(self) -> Resumption:
        """How the stream was resumed, once resumed from here: one retry more."""
        return Resumption(self.retries + 1, self.stall_s)

    def after(self, part: StreamProgress) -> StreamState:
        return replace(self, text=self.text + part.text, tokens=self.tokens + part.tokens,
                       first_token_s=part.first_token_s, last_token_s=part.last_token_s, retries=part.retries,
                       stall_s=part.stall_s, events=self.events + 1)


@dataclass(frozen=True)
class StreamProgress:
    """What one body part added to a streamed completion (text and tokens since the last
    part), with the stream's identity and timings so far."""

    request_id: str
    arrival_s: float
    text: str
    tokens: int
    first_token_s: float | None
    last_token_s: float | None
    retries: int
    stall_s: float

    def state(self) -> StreamState:
        """The state after the first part: the stream as a client holding only it has it."""
        return StreamState(self.request_id, self.arrival_s).after(self)


@dataclass(frozen=True)
class HttpExchange:
    """One HTTP request as the gateway received it (its ASGI scope's fields and whole
    body), and, when another replica died serving it, the stream state to resume from."""

    method: str
    path: str
    root_path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None = None
    resume: StreamState | None = None

    @classmethod
    def of(cls, scope: MutableMapping[str, Any], body: bytes) -> HttpExchange:
        client = scope.get("client")
        return cls(scope["method"], scope["path"], scope.get("root_path", ""), scope.get("query_string", b""),
                   tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", ())), body,
                   tuple(client) if client else None)

    def scope(self) -> dict[str, Any]:
        # ASGI 2.4: a server that reports a client's disconnect by cancelling the app (as
        # the bridge does when the gateway's call is cancelled), so no listener task.
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                "root_path": self.root_path, "query_string": self.query_string, "headers": list(self.headers),
                "client": self.client, "server": None}


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]

    @property
    def is_stream(self) -> bool:
        return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in self.headers)


@dataclass(frozen=True)
class ResponseBody:
    body: bytes
    more_body: bool = False
    progress: StreamProgress | None = None  # set on parts of a streamed completion


ResponsePart = ResponseStart | ResponseBody
ResponseParts = tuple[ResponsePart, ...]


class ExchangeContext:
    """What the routes serving one exchange share with the bridge: the state they resume
    from, and the stream whose progress each body part reports."""

    def __init__(self, resume: StreamState | None) -> None:
        self.resume = resume
        self._stream: ResumableStream | None = None
        self._request_id = ""
        self._sent_parts = 0  # of the stream's progress.text already reported
        self._sent_tokens = 0

    def follow(self, stream: ResumableStream, request_id: str) -> None:
        """Report `stream`'s progress with every body part from now on. What this exchange's
        own resume state holds, the gateway has; what else the stream starts from (a stream a
        federation front resumed here) goes to the gateway with the first part, so that it
        can resume the whole of it."""
        self._stream, self._request_id = stream, request_id
        held = self.resume
        self._sent_parts, self._sent_tokens = (int(bool(held.text)), held.tokens) if held is not None else (0, 0)

    def progress(self) -> StreamProgress | None:
        """What the stream added since the last body part (None if no stream is followed)."""
        if self._stream is None:
            return None
        progress, resumption = self._stream.progress, self._stream.resumption()
        text = "".join(progress.text[self._sent_parts:])
        tokens = progress.tokens - self._sent_tokens
        self._sent_parts, self._sent_tokens = len(progress.text), progress.tokens
        return StreamProgress(self._request_id, progress.arrival_s, text, tokens, progress.first_token_s,
                              progress.last_token_s, resumption.retries, resumption.stall_s)


_CURRENT: ContextVar[ExchangeContext | None] = ContextVar("wattwise_exchange", default=None)


def current_exchange() -> ExchangeContext | None:
    """The exchange being served in this task, if the request came through the gateway."""
    return _CURRENT.get()


def _internal_error() -> ResponseParts:
    body = json.dumps(APIError(500, "The ingress failed to answer.", "server_error").body()).encode()
    return ResponseStart(500, ((b"content-type", b"application/json"),)), ResponseBody(body)


async def run_exchange(app: ASGIApp, exchange: HttpExchange) -> AsyncIterator[ResponseParts]:
    """Serve `exchange` with `app`, yielding the response in batches as it is sent.
    Cancelling the iteration (the gateway's client left) cancels the app, as a client's
    disconnect would."""
    context = ExchangeContext(exchange.resume)
    parts: asyncio.Queue[ResponsePart | None] = asyncio.Queue()
    body_read = False
    started = False

    async def receive() -> dict[str, Any]:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": exchange.body, "more_body": False}
        await asyncio.Event().wait()  # a disconnect arrives as cancellation
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            parts.put_nowait(ResponseStart(message["status"], tuple(message.get("headers", ()))))
        elif message["type"] == "http.response.body":
            more = bool(message.get("more_body", False))
            parts.put_nowait(ResponseBody(bytes(message.get("body", b"")), more, context.progress()))

    async def serve() -> None:
        try:
            await app(exchange.scope(), receive, send)
        finally:
            parts.put_nowait(None)

    token = _CURRENT.set(context)
    try:
        task = asyncio.get_running_loop().create_task(serve())  # the task copies the context
    finally:
        _CURRENT.reset(token)
    try:
        ended = False
        while not ended:
            batch = [await parts.get()]
            while batch[-1] is not None and not parts.empty():
                batch.append(parts.get_nowait())
            sent = tuple(part for part in batch if part is not None)
            ended = batch[-1] is None or any(isinstance(p, ResponseBody) and not p.more_body for p in sent)
            started = started or any(isinstance(p, ResponseStart) for p in sent)
            if sent:
                yield sent
        if task.done() and not task.cancelled() and task.exception() is not None and not started:
            yield _internal_error()
    finally:
        task.cancel()
