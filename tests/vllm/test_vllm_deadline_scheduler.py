"""The deadline scheduler's wrapping of vLLM's `schedule()`, around a stand-in for vLLM's own
(what it hands the base scheduler, and what it restores), without an engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.tiny_model_fixture import require_vllm

require_vllm()

from engines.vllm_deadline_scheduler import _DeadlineFirst


@dataclass
class _Request:
    request_id: str
    priority: int  # its TTFT deadline, ms
    is_prefill_chunk: bool = False
    num_output_tokens: int = 0
    arrival_time: float = 0.0


class _VllmStandIn:
    """Records what each step sees; starts the waiting head when there is room, if `starts`."""

    def __init__(self, running: list[_Request], waiting: list[_Request], max_seqs: int, starts: bool = True) -> None:
        self.running, self.waiting = running, waiting
        self.max_num_running_reqs = self.max_num_active_reqs = max_seqs
        self.starts = starts
        self.seen: list[tuple[list[str], int]] = []

    def schedule(self, *args: Any, **kwargs: Any) -> None:
        self.seen.append(([r.request_id for r in self.running], self.max_num_active_reqs))
        assert len(self.running) <= self.max_num_running_reqs
        if self.starts and self.waiting and len(self.running) < self.max_num_active_reqs:
            self.running.append(self.waiting.pop_request())


class _Scheduler(_DeadlineFirst, _VllmStandIn):
    pass


def test_a_started_prompt_due_later_sits_out_one_step_and_keeps_its_place() -> None:
    decode = _Request("decode", priority=0)
    long = _Request("long", priority=60_000, is_prefill_chunk=True)
    soon = _Request("soon", priority=5_000, is_prefill_chunk=True)  # started, due before the head: keeps going
    head = _Request("head", priority=10_000)
    s = _Scheduler([long, decode, soon], [head], max_seqs=4)
    s.schedule()
    # vLLM saw decodes first, the started prompt due first, and one seat less: the long one's.
    assert s.seen == [(["decode", "soon"], 3)]
    assert [r.request_id for r in s.running] == ["decode", "soon", "long", "head"]
    assert (s.max_num_running_reqs, s.max_num_active_reqs) == (4, 4)
    s.schedule()  # nothing waits: everything runs, started prompts by deadline after the decodes
    assert s.seen[-1] == (["decode", "head", "soon", "long"], 4)


def test_nothing_sits_out_for_a_resumed_head_a_full_engine_or_a_head_that_did_not_start() -> None:
    def long() -> _Request:
        return _Request("long", priority=60_000, is_prefill_chunk=True)

    resumed = _Request("resumed", priority=1_000, num_output_tokens=3)
    s = _Scheduler([long()], [resumed], max_seqs=4)
    s.schedule()
    assert s.seen == [(["long"], 4)]
    full = _Scheduler([long(), _Request("d", 0)], [_Request("head", 1_000)], max_seqs=2)
    full.schedule()
    assert full.seen == [(["d", "long"], 2)]
    # The head did not start when the long prompt sat out (its KV not free): it waits like any other.
    stuck = _Scheduler([long()], [_Request("head", 1_000)], max_seqs=4, starts=False)
    stuck.schedule()
    stuck.schedule()
    assert stuck.seen == [([], 3), (["long"], 4)]


def test_a_prompt_past_its_deadline_goes_behind_those_still_on_time(monkeypatch) -> None:
    """batching.deadline_order's rule: the waiting queue reorders as prompts turn late, and a
    started prompt already late sits out for an on-time head."""
    import engines.vllm_deadline_scheduler as scheduler

    monkeypatch.setattr(scheduler, "_now_ms", lambda: 20_000.0)
    queue = scheduler.DeadlineQueue([_Request("late", 10_000), _Request("on-time", 30_000),
                                     _Request("resumed", 15_000, num_output_tokens=2)], clock_ms=lambda: 20_000.0)
    assert [r.request_id for r in queue] == ["resumed", "on-time", "late"]
    assert queue.pop_request().request_id == "resumed" and queue.peek_request().request_id == "on-time"
    late = _Request("late-started", priority=12_000, is_prefill_chunk=True)
    s = _Scheduler([late], [_Request("head", 25_000)], max_seqs=4)
    s.schedule()
    assert s.seen == [([], 3)]  # it sat out while the on-time head started
