"""Where a prompt waits when prompts wait earliest TTFT deadline first.

One rule for both runtimes: the batcher's waiting queue (`prefill_by_ttft_deadline`), a
vLLM replica's admission gate (`VllmEngineConfig.prefill_by_ttft_deadline`) and vLLM's
scheduler (engines.vllm_deadline_scheduler). A prompt goes before the first waiter due later;
a waiter with no due time (a requeued or resumed request, which keeps the place it was given)
is passed over, never overtaken by its own rule. And a prompt already prefilling yields its
remaining chunks to a fresh waiting prompt due before it (`yields_to_waiting_head`), so a short
prompt waits for one step of a long one.

A prompt already past its TTFT deadline goes behind every prompt still on time (`due_key`): it
has missed its target whatever runs next, while those behind it may still meet theirs. In a
burst beyond what a replica carries, deadline order alone serves the prompts closest to missing
first, so each waits until it is late and the misses run on; this way the burst's misses stay
with the prompts that were late already (code's minutes reshuffled: 9 orders of 36 under 99%
overall, 4 with it; docs/one-controller.md).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

Waiter = TypeVar("Waiter")


def due_key(due_s: float, now_s: float) -> tuple[bool, float]:
    """A prompt's place at `now_s`: those still on time before those already late, each group
    earliest deadline first."""
    return due_s < now_s, due_s


def deadline_insert_index(dues_s: Iterable[float | None], due_s: float, end: int, now_s: float) -> int:
    """The index, at most `end`, before which a prompt due at `due_s` waits among waiters
    due at `dues_s` (None: keeps its place)."""
    key = due_key(due_s, now_s)
    for i, waiter_due_s in enumerate(dues_s):
        if i >= end:
            break
        if waiter_due_s is not None and due_key(waiter_due_s, now_s) > key:
            return i
    return end


def late_ahead(dues_s: Iterable[float | None], now_s: float) -> list[int]:
    """The indices of the waiters past their deadline ahead of the first one still on time
    (none if no waiter is on time): they move behind it, re-inserted by
    `deadline_insert_index`. Stops at that waiter: the ones behind it that are late were
    moved there already."""
    late: list[int] = []
    for i, due_s in enumerate(dues_s):
        if due_s is None:
            continue
        if due_s >= now_s:
            return late
        late.append(i)
    return []


def move_late_behind(queue: deque[Waiter], due_of: Callable[[Waiter], float | None], now_s: float,
                     in_group: Callable[[Waiter], bool] = lambda _: True) -> None:
    """Move the waiters that turned late, in the group leading `queue` (those `in_group`), behind
    the group's waiters still on time (`late_ahead`, then `deadline_insert_index`; `due_of`:
    a waiter's due time, None where it keeps its place). Reads only up to the first waiter on
    time unless one moves: it runs before every engine step."""
    late = late_ahead(map(due_of, itertools.takewhile(in_group, queue)), now_s)
    if not late:
        return
    moved = [queue[i] for i in late]
    for i in reversed(late):
        del queue[i]
    end = sum(1 for _ in itertools.takewhile(in_group, queue))
    for waiter in moved:
        due_s = due_of(waiter)
        assert due_s is not None  # late_ahead picks waiters with a due time only
        queue.insert(deadline_insert_index(map(due_of, queue), due_s, end, now_s), waiter)
        end += 1


def yields_to_waiting_head(due_s: float, head_due_s: float | None, now_s: float) -> bool:
    """Whether a prompt still prefilling, due at `due_s`, lets the first waiting prompt go
    ahead of its remaining chunks: the head is a fresh prompt (`head_due_s` not None; a
    requeued or resumed one has no due time) that goes before it (`due_key`)."""
    return head_due_s is not None and due_key(due_s, now_s) > due_key(head_due_s, now_s)
