"""vLLM's scheduler with prompts' chunks in TTFT-deadline order, as the simulated replicas run.

vLLM schedules its running requests in the order they started, a started prompt's remaining
chunks among them, before any waiting one: a short prompt due in 0.25 s waits out a long
prompt's whole prefill, and a chunk that fills the step's token budget leaves the decodes
behind it none. With `prefill_by_ttft_deadline`, a replica's requests carry their TTFT
deadline as vLLM's priority, and this scheduler orders each step as the simulated batcher
does (batching.continuous_batcher): decodes first, then started prompts by deadline; and a
started prompt sits out the step while a fresh waiting prompt due before it is scheduled
(batching.deadline_order.yields_to_waiting_head), so the short prompt waits for one step of
the long one. A prompt past its deadline goes behind those still on time, waiting
(`DeadlineQueue`, in place of vLLM's priority heap: lateness changes the order as time passes)
and started (batching.deadline_order.due_key). vLLM fills the step's budget with the waiting
prompts; the simulated batcher would give what they leave to the yielding chunks, here those
resume the step after. A head that does not start in the step they sat out for (its KV not
free yet) waits like any other: they do not sit out for it again.

It wraps `schedule()` rather than rewriting it: the yielding requests leave the running list
for the call (keeping their KV blocks), and the step's running-request limits shrink by as
many, so the requests that then run never exceed the engine's `max_num_seqs`. vLLM calls
its scheduler interface not public; `tests/vllm/test_vllm_engine.py` checks this one on the
pinned vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from batching.deadline_order import due_key, yields_to_waiting_head


def _now_ms() -> float:
    """The clock priorities are on: a request's TTFT deadline in ms (engines.vllm_engine)."""
    return time.time() * 1000


def _place(request: Request, now_ms: float) -> tuple[tuple[bool, float], float, str]:
    """Where a waiting request goes at `now_ms`: a prompt not yet answered by its deadline's
    place (due_key), one already answering (resumed after a preemption) by its deadline alone;
    ties as vLLM breaks them."""
    due = float(request.priority)
    place = due_key(due, now_ms) if request.num_output_tokens == 0 else (False, due)
    return place, request.arrival_time, request.request_id


class DeadlineQueue(RequestQueue):
    """vLLM's waiting queue ordered by `_place` at each read: a heap keeps the order of the
    moment each request arrived, and a prompt turning late must move behind those on time."""

    def __init__(self, requests: Iterable[Request] = (), clock_ms: Callable[[], float] = _now_ms) -> None:
        self._requests: list[Request] = list(requests)
        self._clock_ms = clock_ms

    def _ordered(self) -> list[Request]:
        now_ms = self._clock_ms()
        self._requests.sort(key=lambda r: _place(r, now_ms))
        return self._requests

    def add_request(self, request: Request) -> None:
        self._requests.append(request)

    def pop_request(self) -> Request:
        if not self._requests:
            raise IndexError("pop from an empty queue")
        return self._ordered().pop(0)

    def peek_request(self) -> Request:
        if not self._requests:
            raise IndexError("peek at an empty queue")
        return self._ordered()[0]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)  # no front in a priority order, as in vLLM's heap

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self._requests.extend(requests)

    def remove_request(self, request: Request) -> None:
        self._requests.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        gone = requests if isinstance(requests, set) else set(requests)
        self._requests = [r for r in self._requests if r not in gone]

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._ordered()))


class _DeadlineFirst:
    """`schedule()` with decodes first, started prompts by deadline, and those due after the
    waiting head sitting out while it starts (mixed into vLLM's Scheduler and AsyncScheduler:
    which one vLLM picked stays)."""

    running: list[Request]
    waiting: Any
    max_num_running_reqs: int
    max_num_active_reqs: int
    _yielded_to: str | None = None  # the waiting head prompts last sat out for

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = DeadlineQueue(self.waiting)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now_ms = _now_ms()
        self.running.sort(key=lambda r: _decodes_then_by_deadline(r, now_ms))
        yielding = self._yielding(now_ms)
        if not yielding:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        order, aside = self.running, {r.request_id for r in yielding}
        self.running = [r for r in order if r.request_id not in aside]
        self.max_num_running_reqs -= len(aside)
        self.max_num_active_reqs -= len(aside)
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.max_num_running_reqs += len(aside)
            self.max_num_active_reqs += len(aside)
            kept = {r.request_id for r in self.running}  # less any preempted, plus those started
            before = {r.request_id for r in order}
            self.running = ([r for r in order if r.request_id in aside or r.request_id in kept]
                            + [r for r in self.running if r.request_id not in before])

    def _yielding(self, now_ms: float) -> list[Request]:
        """Running prompts with chunks still to prefill that the waiting head is due before,
        when the engine has room to start it. Once per head: a head that did not start when
        they sat out (its KV not free yet) does not stall them step after step."""
        if not self.waiting or len(self.running) >= self.max_num_active_reqs:
            return []
        head = self.waiting.peek_request()
        if head.request_id == self._yielded_to:
            return []
        head_due = head.priority if head.num_output_tokens == 0 else None  # a resumed request keeps its place
        yielding = [r for r in self.running
                    if r.is_prefill_chunk and yields_to_waiting_head(r.priority, head_due, now_ms)]
        if yielding:
            self._yielded_to = head.request_id
        return yielding


def _decodes_then_by_deadline(request: Request, now_ms: float) -> tuple[bool, tuple[bool, float]]:
    """Decodes keep their order, ahead of started prompts, which go by TTFT deadline, the late
    behind those still on time."""
    return request.is_prefill_chunk, due_key(request.priority, now_ms) if request.is_prefill_chunk else (False, 0.0)


class DeadlineFirstScheduler(_DeadlineFirst, Scheduler):
    """vLLM's Scheduler, chunks by TTFT deadline."""


class DeadlineFirstAsyncScheduler(_DeadlineFirst, AsyncScheduler):
    """vLLM's AsyncScheduler (async scheduling on), chunks by TTFT deadline."""
