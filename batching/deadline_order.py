"""Where a prompt waits when prompts wait earliest TTFT deadline first.

One rule for both runtimes: the batcher's waiting queue (`prefill_by_ttft_deadline`) and a
vLLM replica's admission gate (`VllmEngineConfig.prefill_by_ttft_deadline`). A prompt goes
before the first waiter due later; a waiter with no due time (a requeued or resumed request,
which keeps the place it was given) is passed over, never overtaken by its own rule.
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
