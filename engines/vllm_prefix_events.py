"""The prefix blocks a vLLM engine holds, from its KV cache events, as routers name them.

vLLM publishes what its prefix cache stores and evicts (`kv_events_config`: BlockStored with
its block hashes, the parent block's and the blocks' token ids; BlockRemoved; AllBlocksCleared)
on a ZMQ socket. Its hashes are its own (seeded per process), so the replica rebuilds the
app's (core.prefix_cache.block_hashes, chained over `block_tokens`-token windows) from the
token ids: each vLLM block it knows carries its depth, the app's chained hash at the last
window boundary before its end, and the tokens since. A vLLM block ending a window names
that window's prefix block, held while that vLLM block is (vLLM evicts least recently used
blocks, a prompt's last first, so a held block's ancestors are held too).

Blocks of a LoRA adapter's requests hold the adapter's KV, not the base model's: they are
not reported (the ingress hashes no adapter request either). A stored block whose parent
the replica never saw (events before it subscribed) is skipped: its prefix is unknown.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Known:
    """A vLLM block: its depth (tokens up to its end), the chained hash of the app's prefix
    blocks before its last window boundary, and the tokens since that boundary."""

    depth: int
    chain: int
    window: tuple[int, ...]
    ends: int | None  # the app's prefix block this vLLM block completes, if any


class PrefixBlockTracker:
    """vLLM's stored blocks -> the app's prefix blocks held, most recently stored first."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks: dict[Hashable, _Known] = {}
        self._held: OrderedDict[int, int] = OrderedDict()  # the app's prefix block -> vLLM blocks ending it

    def stored(self, hashes: Sequence[Hashable], parent: Hashable | None, token_ids: Sequence[int],
               block_size: int) -> None:
        base = _Known(0, 0, (), None) if parent is None else self._blocks.get(parent)
        for i, block in enumerate(hashes):
            if base is None:
                return  # its prefix is unknown
            if block in self._blocks:  # stored before: counted once
                base = self._blocks[block]
                continue
            window = base.window + tuple(token_ids[i * block_size:(i + 1) * block_size])
            depth, chain, ends = base.depth + block_size, base.chain, None
            if len(window) >= self.block_tokens:  # block_tokens is a multiple of vLLM's block size
                chain = ends = hash((chain, window[:self.block_tokens]))
                window = window[self.block_tokens:]
                self._held[ends] = self._held.get(ends, 0) + 1
                self._held.move_to_end(ends)
            base = self._blocks[block] = _Known(depth, chain, window, ends)

    def removed(self, hashes: Sequence[Hashable]) -> None:
        for block in hashes:
            known = self._blocks.pop(block, None)
            if known is not None and known.ends is not None:
                left = self._held.get(known.ends, 1) - 1
                if left <= 0:
                    self._held.pop(known.ends, None)
                else:
                    self._held[known.ends] = left

    def cleared(self) -> None:
        self._blocks.clear()
        self._held.clear()

    def held(self) -> list[int]:
        return list(reversed(self._held))


class KvEventSubscriber:
    """A thread applying an engine's KV cache events (ZMQ, vLLM's msgpack) to a tracker."""

    def __init__(self, endpoint: str, tracker: PrefixBlockTracker) -> None:
        import zmq

        self.tracker = tracker
        self._lock = threading.Lock()
        self._socket: Any = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVTIMEO, 200)  # wakes to see a close
        self._socket.connect(endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="wattwise-kv-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while self._running:
            try:
                _, _, payload = self._socket.recv_multipart()
            except zmq.Again:
                continue
            except zmq.ZMQError:  # closed
                return
            for event in decoder.decode(payload).events:
                with self._lock:
                    self._apply(event)

    def _apply(self, event: Any) -> None:
        kind = type(event).__name__  # vLLM's BlockStored, BlockRemoved, AllBlocksCleared
        if kind == "BlockStored":
            if event.lora_id is None and getattr(event, "lora_name", None) is None:
                self.tracker.stored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size)
        elif kind == "BlockRemoved":
            self.tracker.removed(event.block_hashes)
        elif kind == "AllBlocksCleared":
            self.tracker.cleared()

    def held(self) -> list[int]:
        with self._lock:
            return self.tracker.held()

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2)
        self._socket.close(linger=0)
