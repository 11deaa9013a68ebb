"""The replica's own admission queue in front of an engine that has none we control.

vLLM admits every request it is given up to its static max_num_seqs; Chiron's local
autoscaler changes the batch limit at run time, so requests wait here until fewer than
`limit` are inside the engine. Waiters are FCFS, except that a mixed replica (Chiron)
asks for `urgent` slots for interactive requests: those wait ahead of every
non-urgent one, and a preempted batch request re-enters with `requeue` at the front
of the non-urgent waiters, so it resumes before batch requests that arrived after it.

An `admits` rule (the batcher's admission chain: throttLL'eM's SLO projection) is asked
about the head waiter whenever a place is free; a refusal holds everyone behind it, as
in the batcher. It is asked again when a request leaves and at `retry()`, which the
engine calls after each of its steps, since a projection changes as requests progress.
A refusal of an urgent waiter calls `on_urgent_refused` (the engine preempts a batch request
for it, as the batcher does: batch work holding what the projection needs would otherwise
keep an interactive prompt waiting until it finished).

`by_deadline` orders each group earliest TTFT deadline first instead of FCFS, by the rule
the batcher's waiting queue follows (batching.deadline_order): a requeued waiter keeps the
front, and a waiter past its deadline goes behind those still on time (read on `clock`, the
clock the deadlines are on).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from batching.deadline_order import deadline_insert_index, move_late_behind

Waiter = tuple[asyncio.Future, Any, float | None]  # (admitted, asked about, TTFT due or None: keeps its place)


def _waiter_due_s(waiter: Waiter) -> float | None:
    return waiter[2]


class AdmissionGate:
    def __init__(self, limit: int, admits: Callable[[Any], bool] | None = None,
                 on_urgent_refused: Callable[[], None] | None = None, by_deadline: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.limit = max(int(limit), 1)
        self.by_deadline = by_deadline
        self.clock = clock
        self.active = 0
        self.admits = admits
        self.on_urgent_refused = on_urgent_refused
        self.refused = 0  # times the rule held the head waiter back
        self._urgent: deque[Waiter] = deque()
        self._waiters: deque[Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._urgent) + len(self._waiters)

    @property
    def waiting_candidates(self) -> list[Any]:
        """What the rule is asked about for each waiter still waiting, in admission order."""
        return [candidate for queue in (self._urgent, self._waiters) for admitted, candidate, _ in queue
                if candidate is not None and not admitted.done()]

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

    def retry(self) -> None:
        """Ask the rule again about the head waiter (its inputs changed: a step ran)."""
        self._wake()

    def _passes(self, candidate: Any) -> bool:
        if self.admits is None or self.admits(candidate):
            return True
        self.refused += 1
        return False

    def _wake(self) -> None:
        if self.by_deadline and self.active < self.limit:
            now_s = self.clock()
            for queue in (self._urgent, self._waiters):
                move_late_behind(queue, _waiter_due_s, now_s)
        while self.active < self.limit and (self._urgent or self._waiters):
            queue = self._urgent or self._waiters
            waiter, candidate, _due_s = queue[0]
            if waiter.done():  # cancelled while waiting
                queue.popleft()
                continue
            if not self._passes(candidate):
                if queue is self._urgent:
                    self._urgent_refused()
                return
            queue.popleft()
            self.active += 1
            waiter.set_result(None)

    def _urgent_refused(self) -> None:
        if self.on_urgent_refused is not None:
            self.on_urgent_refused()

    @asynccontextmanager
    async def slot(self, urgent: bool = False, requeue: bool = False, candidate: Any = None,
                   due_s: float | None = None) -> AsyncIterator[None]:
        """Hold one of `limit` places for the body; cancellation while waiting leaves none held.

        `urgent` waits ahead of all non-urgent waiters; `requeue` (non-urgent only) waits
        first among them. Within their group they wait FCFS, or with `by_deadline` by
        `due_s` (the request's TTFT deadline; requeued waiters keep their place).
        `candidate` is what the `admits` rule is asked about."""
        queue = self._urgent if urgent else self._waiters
        first = self.active < self.limit and not (queue or self._urgent)  # nobody it must wait behind
        if first and self._passes(candidate):
            self.active += 1
        else:
            requeued = requeue and not urgent
            entry = (asyncio.get_running_loop().create_future(), candidate, None if requeued else due_s)
            if requeued:
                queue.appendleft(entry)
            elif self.by_deadline and due_s is not None:
                queue.insert(deadline_insert_index(map(_waiter_due_s, queue), due_s, len(queue), self.clock()), entry)
            else:
                queue.append(entry)
            if first and urgent:  # the rule refused it
                self._urgent_refused()
            try:
                await entry[0]
            except asyncio.CancelledError:
                if entry[0].done() and not entry[0].cancelled():
                    self.active -= 1  # admitted and cancelled in the same tick
                    self._wake()
                elif entry in queue:
                    queue.remove(entry)
                raise
        try:
            yield
        finally:
            self.active -= 1
            self._wake()
