"""Finish a request on another replica when its replica fails, without repeating tokens.

A replica can die mid-stream (OOM, node loss, a kill). The client already holds the
tokens streamed so far, so the ingress re-issues the rest as a continuation: the
prompt plus the text already sent, with max_tokens reduced by the tokens already sent.
Serve's router drops a dead replica from its candidates, so the retry lands on
another replica of the pool (or on the next fallback pool). Non-streaming requests
are retried from scratch. Retries are bounded; past the bound the error surfaces
and the ingress answers with a retryable 503 (or an error event in a stream).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray.exceptions import RayError, TaskCancelledError

from core.request import Request
from deployments.messages import ReplicaChunk, Reply, Shed, Squashed
from engines.protocol import RESUME_OFFSET_KEY


class StreamBroken(Exception):
    """A replica stream ended without a final chunk, or a continuation could not start."""


def is_retryable(exc: BaseException) -> bool:
    """Replica failures (actor died, unavailable, crashed task, broken stream) are worth
    another replica; a cancellation (the client left) is not."""
    return isinstance(exc, StreamBroken) or (isinstance(exc, RayError) and not isinstance(exc, TaskCancelledError))


def is_refusal(reply: Reply) -> bool:
    """A replica answered without serving: squashed after waiting, or shed on overload."""
    return isinstance(reply, (Squashed, Shed))


@dataclasses.dataclass(frozen=True)
class Resumption:
    """How a response survived replica failures, for its report and the SLO: a resume
    costs the client a silence that averaged TBT would hide."""

    retries: int = 0
    # The longest the client waited across a resume: its last chunk before the failure
    # to the first chunk after it (0 if none was resumed mid-stream).
    stall_s: float = 0.0

    @property
    def resumed(self) -> bool:
        return self.retries > 0


@dataclasses.dataclass
class Progress:
    """What the client already holds of one streamed response."""

    arrival_s: float
    text: list[str] = dataclasses.field(default_factory=list)
    tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None

    def add(self, chunk: ReplicaChunk, now_s: float) -> None:
        if chunk.num_tokens and self.first_token_s is None:
            self.first_token_s = now_s
        if chunk.num_tokens:
            self.last_token_s = now_s
        self.text.append(chunk.text)
        self.tokens += chunk.num_tokens


def continuation(request: Request, progress: Progress, now_s: float) -> Request | None:
    """The request for the rest of the response; None if nothing is left to generate."""
    if progress.tokens == 0:
        return request
    remaining = request.max_tokens - progress.tokens
    target = request.target_output_tokens
    if target is not None:
        target -= progress.tokens
        if target <= 0:
            return None
    if remaining <= 0:
        return None
    return dataclasses.replace(
        request,
        prompt_tokens=request.prompt_tokens + progress.tokens,
        max_tokens=remaining,
        target_output_tokens=target,
        prompt_text=request.prompt_text + "".join(progress.text),
        arrival_s=now_s,  # a new arrival at the replica that finishes it (squash, TTFT EWMA)
        metadata={**request.metadata, RESUME_OFFSET_KEY: str(progress.tokens)},
    )


def merged_final(request: Request, progress: Progress, final: ReplicaChunk | None, now_s: float) -> ReplicaChunk:
    """The final chunk as if one replica had served it all: usage counts every token the
    client received and times run from the original arrival. Energy spent on the failed
    replica is unknown and not included."""
    if final is None:  # everything was sent before the failure; only the ending was lost
        return ReplicaChunk("", 0, "length")
    if final.usage is None:
        return final
    first = progress.first_token_s if progress.first_token_s is not None else now_s
    return dataclasses.replace(final, usage=dataclasses.replace(
        final.usage, prompt_tokens=request.prompt_tokens, completion_tokens=progress.tokens + final.num_tokens,
        ttft_s=first - request.arrival_s, e2e_s=now_s - request.arrival_s))


class ResumableStream:
    """The chunks of one streamed response, resumed on another replica after a failure.

    `start(request, pool)` issues a streaming call; `pools` lists the pool serving the
    request first, then fallbacks (retry i goes to pools[min(i, last)]). A stream another
    ingress replica began (deployments.asgi_bridge) starts from the `progress` its client
    holds and the `inherited` resumption; only retries made here count against `max_retries`."""

    def __init__(self, start: Callable[[Request, str], Any], request: Request, pools: list[str],
                 max_retries: int, on_retry: Callable[[str], None] = lambda pool: None,
                 progress: Progress | None = None, inherited: Resumption = Resumption()) -> None:
        self.start, self.request, self.pools = start, request, pools
        self.max_retries, self.on_retry = max_retries, on_retry
        self.retries = 0
        self.progress = progress if progress is not None else Progress(arrival_s=request.arrival_s)
        self.inherited = inherited
        self.pool = pools[0]
        self._stall_s = inherited.stall_s
        # The client's last token before a resume: set while a resume is under way.
        self._broken_at_s = self.progress.last_token_s if inherited.resumed else None
        self._final: ReplicaChunk | None = None  # sent instead of a call when nothing is left
        now = time.time()
        rest = continuation(request, self.progress, now)  # the request itself if nothing was sent
        if rest is None:
            self._gen: Any = None
            self._final = merged_final(request, self.progress, None, now)
        else:
            self._gen = start(rest, self.pool)

    def resumption(self) -> Resumption:
        return Resumption(self.inherited.retries + self.retries, self._stall_s)

    def __aiter__(self) -> ResumableStream:
        return self

    async def __anext__(self) -> Reply:
        if self._final is not None:
            final, self._final = self._final, None
            return self._account(final)
        while True:
            try:
                chunk = await self._gen.__anext__()
            except StopAsyncIteration:
                exc: BaseException = StreamBroken("the replica ended the stream without a final chunk")
            except Exception as err:  # sorted by is_retryable below
                exc = err
            else:
                if self.resumption().resumed and is_refusal(chunk) and self.progress.tokens:
                    exc = StreamBroken("the continuation was refused by the replica")
                else:
                    return self._account(chunk)
            if not is_retryable(exc) or self.retries >= self.max_retries or not self._resumable():
                raise exc
            resumed = self._resume()
            if resumed is not None:
                return resumed

    def _account(self, chunk: Reply) -> Reply:
        if not isinstance(chunk, ReplicaChunk):  # a refusal: nothing reached the client
            return chunk
        now = time.time()
        if chunk.finish_reason and self.resumption().resumed and self.progress.tokens:
            chunk = merged_final(self.request, self.progress, chunk, now)
        if self._broken_at_s is not None and chunk.num_tokens:
            self._stall_s = max(self._stall_s, now - self._broken_at_s)
            self._broken_at_s = None
        self.progress.add(chunk, now)
        return chunk

    def _resumable(self) -> bool:
        """A structured output's grammar starts from the text's start: a continuation would
        restart it mid-way, so a constrained stream that sent tokens ends with an error."""
        return self.request.sampling.structured is None or self.progress.tokens == 0

    def _resume(self) -> ReplicaChunk | None:
        """Issue the continuation; if nothing is left, the final chunk to send instead."""
        self.cancel()
        self.retries += 1
        if self._broken_at_s is None:
            self._broken_at_s = self.progress.last_token_s
        self.pool = self.pools[min(self.retries, len(self.pools) - 1)]
        self.on_retry(self.pool)
        now = time.time()
        rest = continuation(self.request, self.progress, now)
        if rest is None:
            return merged_final(self.request, self.progress, None, now)
        self._gen = self.start(rest, self.pool)
        return None

    def cancel(self) -> None:
        cancel = getattr(self._gen, "cancel", None)
        if cancel is not None:
            cancel()


async def call_with_retries(call: Callable[[str], Awaitable[Reply]], pools: list[str], max_retries: int,
                            on_retry: Callable[[str], None] = lambda pool: None) -> Reply:
    """A non-streaming call, retried from scratch on a replica failure (nothing was sent yet)."""
    for attempt in range(max_retries + 1):
        try:
            return await call(pools[min(attempt, len(pools) - 1)])
        except Exception as exc:  # sorted by is_retryable
            if not is_retryable(exc) or attempt == max_retries:
                raise
            on_retry(pools[min(attempt + 1, len(pools) - 1)])
    raise AssertionError("unreachable: the last attempt returns or raises")
