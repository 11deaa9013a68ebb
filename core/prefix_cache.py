"""Prompt prefixes as chains of block hashes, and an LRU of the blocks a replica holds.

A prompt's tokens are cut into blocks of `block_tokens`; block i's hash covers the hash
of block i - 1 and its own tokens, so equal hashes mean equal prefixes up to there (as
vLLM's prefix cache keys its blocks, and as Mooncake's trace gives its `hash_ids`). A
replica holds the blocks of the prompts it computed until newer ones evict them
(`PrefixCache`, least recently used first); a prompt whose first k blocks it holds
computes only the rest. The modelled replicas keep one (batching.continuous_batcher);
vLLM keeps its own and reports it (engines.vllm_prefix_events); routers rank replicas by
the blocks of a prompt each holds (core.replica_choice).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


def block_hashes(token_ids: Sequence[int], block_tokens: int) -> tuple[int, ...]:
    """The chained hashes of the full blocks of `token_ids` (a last partial block has none:
    engines cache full blocks only). Python's hash of a tuple of ints is the same in every
    process, so an ingress and the replicas agree on them."""
    out: list[int] = []
    parent = 0
    for end in range(block_tokens, len(token_ids) + 1, block_tokens):
        parent = hash((parent, tuple(token_ids[end - block_tokens:end])))
        out.append(parent)
    return tuple(out)


def chained(ids: Iterable[Hashable]) -> tuple[int, ...]:
    """Block ids whose equality means equal content, but which are not chained (Mooncake's
    `hash_ids`, a generator's) as chained hashes: equal only where the whole prefix is equal."""
    out: list[int] = []
    parent = 0
    for block in ids:
        parent = hash((parent, block))
        out.append(parent)
    return tuple(out)


class PrefixCache:
    """The prefix blocks a replica holds, least recently used evicted first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(0, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def matched(self, hashes: Sequence[int]) -> int:
        """How many of the prompt's first blocks it holds (the cached prefix, in blocks)."""
        n = 0
        for block in hashes:
            if block not in self._blocks:
                break
            n += 1
        return n

    def use(self, hashes: Sequence[int]) -> None:
        """The blocks were computed or read now: hold them, the most recent last; evict the
        least recently used beyond capacity."""
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def held(self) -> list[int]:
        """Every block held, the most recent first."""
        return list(reversed(self._blocks))

    def clear(self) -> None:
        self._blocks.clear()
