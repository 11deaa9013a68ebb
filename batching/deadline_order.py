"""Where a prompt waits when prompts wait earliest TTFT deadline first.

One rule for both runtimes: the batcher's waiting queue (`prefill_by_ttft_deadline`) and a
vLLM replica's admission gate (`VllmEngineConfig.prefill_by_ttft_deadline`). A prompt goes
before the first waiter due later; a waiter with no due time (a requeued or resumed request,
which keeps the place it was given) is passed over, never overtaken by its own rule. And a
prompt already prefilling yields its remaining chunks to a fresh waiting prompt due before it
(`yields_to_waiting_head`): in the batcher's prefill queue, and in vLLM's scheduler
(engines.vllm_deadline_scheduler), so a short prompt waits for one step of a long one.
"""

from __future__ import annotations

from collections.abc import Iterable


def deadline_insert_index(dues_s: Iterable[float | None], due_s: float, end: int) -> int:
    """The index, at most `end`, before which a prompt due at `due_s` waits among waiters
    due at `dues_s` (None: keeps its place)."""
    for i, waiter_due_s in enumerate(dues_s):
        if i >= end:
            break
        if waiter_due_s is not None and waiter_due_s > due_s:
            return i
    return end


def yields_to_waiting_head(due_s: float, head_due_s: float | None) -> bool:
    """Whether a prompt still prefilling, due at `due_s`, lets the first waiting prompt go
    ahead of its remaining chunks: the head is a fresh prompt (`head_due_s` not None; a
    requeued or resumed one has no due time) due before it."""
    return head_due_s is not None and due_s > head_due_s
