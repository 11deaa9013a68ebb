"""The replica's own admission queue in front of an engine that has none we control.

vLLM admits every request it is given up to its static max_num_seqs; Chiron's local
autoscaler changes the batch limit at run time, so requests wait here, FCFS, until
fewer than `limit` are inside the engine.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class AdmissionGate:
    def __init__(self, limit: int) -> None:
        self.limit = max(int(limit), 1)
        self.active = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def set_limit(self, limit: int) -> None:
        """Applies to admissions only: requests inside are never evicted for it."""
        self.limit = max(int(limit), 1)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.active += 1
                waiter.set_result(None)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of `limit` places for the body; cancellation while waiting leaves none held."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.active -= 1  # admitted and cancelled in the same tick
                    self._wake()
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
        try:
            yield
        finally:
            self.active -= 1
            self._wake()
