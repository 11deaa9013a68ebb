"""vLLM's scheduler with prompts' chunks in TTFT-deadline order, as the simulated replicas run.

vLLM schedules its running requests in the order they started, a started prompt's remaining
chunks among them, before any waiting one: a short prompt due in 0.25 s waits out a long
prompt's whole prefill, and a chunk that fills the step's token budget leaves the decodes
behind it none. With `prefill_by_ttft_deadline`, a replica's requests carry their TTFT
deadline as vLLM's priority, and this scheduler orders each step as the simulated batcher
does (batching.continuous_batcher): decodes first, then started prompts by deadline; and a
started prompt sits out the step while a fresh waiting prompt due before it is scheduled
(batching.deadline_order.yields_to_waiting_head), so the short prompt waits for one step of
the long one. vLLM fills the step's budget with the waiting prompts; the simulated batcher
would give what they leave to the yielding chunks, here those resume the step after. A head
that does not start in the step they sat out for (its KV not free yet) waits like any other:
they do not sit out for it again.

It wraps `schedule()` rather than rewriting it: the yielding requests leave the running list
for the call (keeping their KV blocks), and the step's running-request limits shrink by as
many, so the requests that then run never exceed the engine's `max_num_seqs`. vLLM calls
its scheduler interface not public; `tests/vllm/test_vllm_engine.py` checks this one on the
pinned vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from batching.deadline_order import yields_to_waiting_head


class _DeadlineFirst:
    """`schedule()` with decodes first, started prompts by deadline, and those due after the
    waiting head sitting out while it starts (mixed into vLLM's Scheduler and AsyncScheduler:
    which one vLLM picked stays)."""

    running: list[Request]
    waiting: Any
    max_num_running_reqs: int
    max_num_active_reqs: int
    _yielded_to: str | None = None  # the waiting head prompts last sat out for

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.running.sort(key=_decodes_then_by_deadline)
        yielding = self._yielding()
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

    def _yielding(self) -> list[Request]:
        """Running prompts with chunks still to prefill that the waiting head is due before,
        when the engine has room to start it. Once per head: a head that did not start when
        they sat out (its KV not free yet) does not stall them step after step."""
        if not self.waiting or len(self.running) >= self.max_num_active_reqs:
            return []
        head = self.waiting.peek_request()
        if head.request_id == self._yielded_to:
            return []
        head_due = head.priority if head.num_output_tokens == 0 else None  # a resumed request keeps its place
        yielding = [r for r in self.running if r.is_prefill_chunk and yields_to_waiting_head(r.priority, head_due)]
        if yielding:
            self._yielded_to = head.request_id
        return yielding


def _decodes_then_by_deadline(request: Request) -> tuple[bool, int]:
    """Decodes keep their order, ahead of started prompts, which go by TTFT deadline."""
    return (request.is_prefill_chunk, request.priority if request.is_prefill_chunk else 0)


class DeadlineFirstScheduler(_DeadlineFirst, Scheduler):
    """vLLM's Scheduler, chunks by TTFT deadline."""


class DeadlineFirstAsyncScheduler(_DeadlineFirst, AsyncScheduler):
    """vLLM's AsyncScheduler (async scheduling on), chunks by TTFT deadline."""
