"""One request's way through the federation: placed on a cloud, moved, resumed, answered.

The dispatcher (app.cloud_dispatch) picks the cloud. Until the cloud's first token the
request can still go elsewhere: a cloud that does not answer, answers 5xx or 503 (it then
rests for its Retry-After), or 429 (only this request avoids it), and an idle cloud that
takes it over (Mico's offloading) all send it on, and the client sees nothing of it. Once
tokens flowed, a failure resumes the stream on another cloud as the gateway resumes one
inside an app: the request plus what the client holds (app.federation_wire); the client
sees one stream, a pause, no token repeated or missing. Past `failover_s` of failures
since it last made progress the request ends with a retryable error: a 503 before it
started, an OpenAI error event after.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from app.cloud_dispatch import CloudDispatcher
from app.federation_wire import PROGRESS_FIELD, RESUME_FIELD, HeldStream, progress_of
from app.openai_api import APIError
from federation.metrics import FrontMetrics
from federation.upstream import CloudClient, Refused, Unreachable, UpstreamStream

RETRYABLE_ERROR_TYPES = ("server_error", "overloaded")


class CloudAnswer(Exception):
    """A cloud's own error answer, passed to the client as it came (a 4xx it would give
    on any cloud, or the last refusal once every cloud refused)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.status)
        self.refused = refused


class _Broken(Exception):
    """The stream carried an error event."""

    def __init__(self, event: dict[str, Any], retryable: bool) -> None:
        super().__init__(event)
        self.event, self.retryable = event, retryable


class Front(Protocol):
    """What a relay needs of the front door."""

    dispatcher: CloudDispatcher
    clouds: list[CloudClient]
    metrics: FrontMetrics
    failover_s: float
    relays: dict[str, Relay]

    def now_s(self) -> float: ...

    def intensity(self) -> dict[int, float] | None: ...


@dataclass
class Held:
    """What the client holds of the response so far: the stream as a resume sends it, its
    text kept in parts (joined only for a resume), and, while resuming, the client's last
    token before the failure."""

    # The request id is the cloud's, from the first event's id (cmpl-<id>); empty before.
    stream: HeldStream
    text: list[str] = field(default_factory=list)
    broken_at_s: float | None = None

    def resume_state(self) -> HeldStream:
        return replace(self.stream, text="".join(self.text))


@dataclass(frozen=True)
class RequestShape:
    """The request as the front classified it."""

    path: str
    body: dict[str, Any]  # as the client sent it
    headers: Mapping[str, str]  # the client's (those forwarded: app.federation.upstream)
    service_class: str
    model: str
    cost_tokens: float  # prompt + predicted output
    prompt_tokens: int
    text_of: Callable[[dict[str, Any]], str]  # an event's text


class Relay:
    def __init__(self, front: Front, shape: RequestShape) -> None:
        self.front, self.shape = front, shape
        self.id = uuid.uuid4().hex  # the dispatcher's, not the cloud's
        self.held = Held(HeldStream(request_id="", arrival_s=time.time()))
        self.cloud: int | None = None
        self._moved = asyncio.Event()
        self._move_to: int | None = None
        self._serving = [k for k, c in enumerate(front.clouds) if shape.model in c.config.models]

    def move_to(self, cloud: int) -> bool:
        """Offload (Mico): take the request to `cloud` if it has not started; False if it had."""
        if self.held.stream.events or self._moved.is_set():
            return False
        self._move_to = cloud
        self._moved.set()
        return True

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """The events for the client, as they come. Raises APIError or CloudAnswer before
        the first one if no cloud could start the request."""
        front = self.front
        front.relays[self.id] = self
        try:
            while True:
                cloud, stream, event = await self._open()
                try:
                    while event is not None:
                        out = self._absorb(cloud, event)
                        if out is not None:
                            self.held.stream = replace(self.held.stream, events=self.held.stream.events + 1)
                            yield out
                        event = await stream.next()
                    front.dispatcher.succeeded(cloud)
                    return
                except (Unreachable, _Broken) as failure:
                    if isinstance(failure, _Broken) and not failure.retryable:
                        yield failure.event
                        return
                    front.dispatcher.failed(cloud, front.now_s())
                    front.metrics.attempt(front.clouds[cloud].name, "broken")
                    self.held.broken_at_s = self.held.broken_at_s or self.held.stream.last_token_s
                finally:
                    await stream.close()
        finally:
            front.relays.pop(self.id, None)
            front.dispatcher.finish(self.id)

    async def _open(self) -> tuple[int, UpstreamStream, dict[str, Any] | None]:
        """A cloud's stream and its first event: the dispatcher's cloud, or another after a
        failure, until one starts or `failover_s` passes."""
        front = self.front
        failing_since_s = front.now_s()
        previous = self.cloud  # where a resumed stream broke
        tried: set[int] = set()
        last_refusal: Refused | None = None
        while True:
            now_s = front.now_s()
            cloud = self._move_to if self._moved.is_set() else front.dispatcher.choose(
                self._left_tokens(), now_s, tried | self._not_serving(), front.intensity())
            self._moved.clear()
            self._move_to = None
            if cloud is None:
                rate_limited = last_refusal is not None and last_refusal.status == 429 and set(self._serving) <= tried
                if rate_limited or now_s - failing_since_s >= front.failover_s or not self._serving:
                    raise self._give_up(last_refusal, now_s)
                if not any(front.dispatcher.available(k, now_s) and k not in tried for k in self._serving):
                    tried.clear()  # every cloud tried: each again once it rests no more
                await asyncio.sleep(min(max(front.dispatcher.retry_after_s(now_s), 0.05), 1.0))
                continue
            self._place(cloud)
            name = front.clouds[cloud].name
            try:
                answer = await front.clouds[cloud].open(self.shape.path, self._body(), self.shape.headers,
                                                        self.shape.service_class)
            except Unreachable:
                front.dispatcher.failed(cloud, front.now_s())
                front.metrics.attempt(name, "unreachable")
                tried.add(cloud)
                continue
            if isinstance(answer, Refused):
                last_refusal = answer
                if answer.overloaded:
                    front.dispatcher.failed(cloud, front.now_s(), answer.retry_after_s)
                    front.metrics.attempt(name, "overloaded")
                elif answer.status == 429:
                    front.metrics.attempt(name, "rate_limited")
                else:  # the request itself is wrong: every cloud would say so
                    front.metrics.attempt(name, "refused")
                    raise CloudAnswer(answer)
                tried.add(cloud)
                continue
            try:
                first = await self._first_event(answer)
            except BaseException:  # the client left: so does the cloud's call
                await answer.close()
                raise
            if first is _MOVED:
                await answer.close()
                front.metrics.attempt(name, "moved")
                continue
            if isinstance(first, Unreachable):
                await answer.close()
                front.dispatcher.failed(cloud, front.now_s())
                front.metrics.attempt(name, "broken")
                tried.add(cloud)
                continue
            assert not isinstance(first, _Sentinel)
            front.metrics.attempt(name, "started")
            if self.held.stream.events and previous is not None:
                front.metrics.resumes.labels(front.clouds[previous].name, name).inc()
            return cloud, answer, first

    async def _first_event(self, stream: UpstreamStream) -> dict[str, Any] | Unreachable | _Sentinel | None:
        """The stream's first event, or _MOVED if an idle cloud took the request first."""
        read = asyncio.ensure_future(stream.next())
        moved = asyncio.ensure_future(self._moved.wait())
        try:
            await asyncio.wait({read, moved}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            read.cancel()
            raise
        finally:
            moved.cancel()
        if not read.done():
            read.cancel()
            try:
                await read
            except (asyncio.CancelledError, Unreachable):
                pass
            return _MOVED
        try:
            return read.result()
        except Unreachable as exc:
            return exc

    def _place(self, cloud: int) -> None:
        dispatcher = self.front.dispatcher
        if dispatcher.cloud_of(self.id) is None:
            dispatcher.dispatch(cloud, self.id, self._left_tokens(), self.shape.prompt_tokens)
        elif dispatcher.cloud_of(self.id) != cloud:
            dispatcher.move(self.id, cloud)
        self.cloud = cloud

    def _left_tokens(self) -> float:
        held = self.front.dispatcher.cloud_of(self.id)
        if held is None:
            return max(self.shape.cost_tokens - self.held.stream.tokens, 1.0)
        return max(self.front.dispatcher.ledger.left_tokens(self.id), 1.0)

    def _not_serving(self) -> set[int]:
        return set(range(len(self.front.clouds))) - set(self._serving)

    def _body(self) -> dict[str, Any]:
        """The client's request, streamed with usage; a resume adds what the client holds."""
        body = {**self.shape.body, "stream": True, "stream_options": {"include_usage": True}}
        if self.held.stream.events:
            body[RESUME_FIELD] = asdict(self.held.resume_state())
            self.held.stream = replace(self.held.stream, retries=self.held.stream.retries + 1)
        return body

    def _absorb(self, cloud: int, event: dict[str, Any]) -> dict[str, Any] | None:
        """Book an event's progress and return it as the client gets it (None: not for it).
        Raises _Broken on an error event."""
        if "error" in event:
            error = event["error"] if isinstance(event["error"], dict) else {}
            raise _Broken(event, error.get("type") in RETRYABLE_ERROR_TYPES)
        held, front = self.held, self.front
        if not held.stream.request_id and isinstance(event.get("id"), str):
            held.stream = replace(held.stream, request_id=event["id"].removeprefix("cmpl-"))
        tokens = progress_of(event)
        if event.get("choices"):
            text = self.shape.text_of(event)
            tokens = tokens if tokens is not None else int(bool(text))
            if tokens:
                now, stream = time.time(), held.stream
                stall_s = stream.stall_s
                if held.broken_at_s is not None:
                    stall_s = max(stall_s, now - held.broken_at_s)
                    held.broken_at_s = None
                held.stream = replace(stream, stall_s=stall_s, first_token_s=stream.first_token_s or now,
                                      last_token_s=now, tokens=stream.tokens + tokens)
                front.dispatcher.progress(self.id, tokens)
                front.metrics.tokens.labels(front.clouds[cloud].name).inc(tokens)
            held.text.append(text)
        front.dispatcher.started(self.id)
        out = {k: v for k, v in event.items() if k != PROGRESS_FIELD}
        if not out.get("choices") and "usage" in out and not self._client_wants_usage():
            return None
        return out

    def _client_wants_usage(self) -> bool:
        """A unary response carries usage; a stream only if its client asked for it."""
        options = self.shape.body.get("stream_options")
        return not self.shape.body.get("stream") or bool(isinstance(options, dict) and options.get("include_usage"))

    def _give_up(self, refused: Refused | None, now_s: float) -> Exception:
        """What the client gets when no cloud took the request: the clouds' own answer if it
        was a rate limit, else a 503 with the time until one rests no more."""
        if refused is not None and refused.status == 429:
            return CloudAnswer(refused)
        retry_after_s = max(self.front.dispatcher.retry_after_s(now_s),
                            (refused.retry_after_s if refused is not None else None) or 1.0)
        return APIError(503, f"No cloud could take the request within {self.front.failover_s:.0f} s; retry.",
                        "overloaded", code="clouds_unavailable", retry_after_s=retry_after_s)


class _Sentinel:
    pass


_MOVED = _Sentinel()

