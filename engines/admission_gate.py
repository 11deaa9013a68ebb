"""The replica's own admission queue in front of an engine that has none we control.

vLLM admits every request it is given up to its static max_num_seqs; Chiron's local
autoscaler changes the batch limit at run time, so requests wait here until fewer than
`limit` are inside the engine. Waiters are FCFS, except that a mixed replica (Chiron)
asks for `urgent` slots for interactive requests: those wait ahead of every
non-urgent one, and a preempted batch request re-enters with `requeue` at the front
of the non-urgent waiters, so it resumes before batch requests that arrived after it.
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
        self._urgent: deque[asyncio.Future] = deque()
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._urgent) + len(self._waiters)

    @property
    def urgent_waiting(self) -> int:
        return len(self._urgent)

    @property
    def would_wait(self) -> bool:
        """Whether a request asking now has to queue (no await in between: asyncio)."""
        return self.active >= self.limit or self.waiting > 0

    def set_limit(self, limit: int) -> None:
        """Applies to admissions only: requests inside are never evicted for it."""
        self.limit = max(int(limit), 1)
        self._wake()

    def _wake(self) -> None:
        while self.active < self.limit and (self._urgent or self._waiters):
            waiter = (self._urgent or self._waiters).popleft()
            if not waiter.done():
                self.active += 1
                waiter.set_result(None)

    @asynccontextmanager
    async def slot(self, urgent: bool = False, requeue: bool = False) -> AsyncIterator[None]:
        """Hold one of `limit` places for the body; cancellation while waiting leaves none held.

        `urgent` waits ahead of all non-urgent waiters; `requeue` (non-urgent only) waits
        first among them. Both stay FCFS within their group."""
        if not self.would_wait:
            self.active += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            queue = self._urgent if urgent else self._waiters
            if requeue and not urgent:
                queue.appendleft(waiter)
            else:
                queue.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.active -= 1  # admitted and cancelled in the same tick
                    self._wake()
                elif waiter in queue:
                    queue.remove(waiter)
                raise
        try:
            yield
        finally:
            self.active -= 1
            self._wake()
