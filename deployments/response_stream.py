"""An async generator behind the call surface of Serve's streaming response: iterate it, or
`cancel()` it when the client leaves (the ingress calls both on whatever a stream call
returned). Used where a stream is made in the caller's process, not by a Serve handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Generic, TypeVar

T = TypeVar("T")


class ResponseStream(Generic[T]):
    def __init__(self, chunks: AsyncGenerator[T, None]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> ResponseStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self._chunks.__anext__()

    def cancel(self) -> None:
        """Close the generator, running its cleanup; one being pulled right now is closed by
        the cancellation of the task pulling it."""
        if not getattr(self._chunks, "ag_running", False):
            asyncio.get_running_loop().create_task(self._chunks.aclose())
