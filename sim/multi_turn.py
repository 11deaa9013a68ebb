"""Multi-turn conversations for traces without session ids (the Azure traces): each
request becomes a turn whose prompt extends an earlier turn's, so prompts share prefix blocks
as chat traffic does. Opt in: a trace is left as is unless this is applied (bench prefix)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from core.prefix_cache import chained
from sim.workload import Workload


@dataclass(frozen=True)
class Sessions:
    """How `multi_turn` groups a trace's requests into conversations (its assumptions).

    A request continues an open conversation with probability `continue_share`, one whose
    context so far (last prompt plus its answer) its prompt is at least as long as: its prompt
    is that context and the new message. Else it opens one, whose prompt starts with one of
    `system_prompts` system prompts of `system_tokens` tokens (the same app's users share one).
    A conversation closes after `idle_s` without a turn. Which open conversation it continues
    is drawn uniformly: a trace without session ids says nothing better."""

    block_tokens: int = 128
    continue_share: float = 0.7
    idle_s: float = 600.0
    system_prompts: int = 16
    system_tokens: int = 512


def multi_turn(w: Workload, rng: np.random.Generator, sessions: Sessions = Sessions()) -> Workload:
    """The trace's requests (arrivals and lengths unchanged) as turns of conversations that
    extend the previous turn's prompt (`Sessions` states how), with each prompt's prefix
    blocks: equal where two prompts share their conversation's (or system prompt's) tokens."""
    b = sessions.block_tokens
    open_: dict[int, tuple[float, int]] = {}  # conversation -> (last turn's arrival, its context tokens)
    system_of: dict[int, int] = {}
    prefix: list[tuple[int, ...]] = []
    for i in range(len(w)):
        now, prompt = float(w.arrival_s[i]), int(w.prompt_tokens[i])
        for s in [s for s, (t, _) in open_.items() if now - t > sessions.idle_s]:
            del open_[s]
        fits = [s for s, (_, context) in open_.items() if context <= prompt]
        if fits and rng.random() < sessions.continue_share:
            conversation = fits[int(rng.integers(len(fits)))]
        else:
            conversation = len(system_of)
            system_of[conversation] = int(rng.integers(sessions.system_prompts))
        open_[conversation] = (now, prompt + int(w.output_tokens[i]))
        system_blocks = sessions.system_tokens // b
        prefix.append(chained((0, system_of[conversation], k) if k < system_blocks  # 0: a system prompt's block
                              else (1, conversation, k) for k in range(prompt // b)))
    return replace(w, prefix=tuple(prefix), prefix_block_tokens=b)
