"""Prompt/token splitting with real KV transfer on the CPU: the token engine loads the
prompt engine's KV (vLLM's prompt-token stats say how much) and produces exactly the
greedy tokens of an unsplit run; with the KV missing or damaged it recomputes and still
completes. Our BlockFileKVConnector hands the replica the prompt's blocks to ship (the
Serve test sends them through Ray's object store); vLLM's ExampleConnector moves them
through a shared directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import safetensors.torch

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from tests.tiny_model_fixture import hf_greedy, loop, require_vllm, running_engine, tiny_model  # noqa: F401 (fixture)
from wattwise.tiny_model import stdlib_docstrings, tiny_engine_config

require_vllm()

from engines.factory import make_engine
from engines.kv_block_files import block_file, block_keys
from engines.vllm_engine import VllmEngine

BLOCK_TOKENS = tiny_engine_config(Path())["block_size"]


def _request(engine, prompt: str, rid: str) -> Request:
    return Request(rid, engine.count_tokens(prompt), 24, time.time(), SLO(ttft_s=60, tbt_s=10),
                   prompt_text=prompt, sampling=Sampling(temperature=0.0))


async def _text(engine, request: Request) -> str:
    return "".join([c.text async for c in engine.generate(request)])


def test_split_is_lossless_and_a_lost_transfer_recomputes(tiny_model: Path, tmp_path: Path) -> None:
    store = tmp_path / "kv"
    store.mkdir()
    prompt = stdlib_docstrings()[4][:700]  # a few hundred tokens: several 32-token KV blocks

    def config(role: str) -> dict:
        return tiny_engine_config(tiny_model, enable_prefix_caching=False,
                                  kv_transfer={"role": role, "connector": "ExampleConnector",
                                                              "storage_path": str(store)})

    async def run() -> tuple[str, str, int, tuple[int, int], tuple[int, int]]:
        prompt_engine = make_engine(config("kv_producer"))
        prompt_tokens = await prompt_engine.prefill(_request(prompt_engine, prompt, "p1"))
        await prompt_engine.shutdown()
        assert any(store.iterdir()), "the prompt engine stored no KV"
        token_engine = make_engine(config("kv_consumer"))
        try:
            split = await _text(token_engine, _request(token_engine, prompt, "d1"))
            after_split = _prompt_sources(token_engine)
            shutil.rmtree(store)  # the transfer is lost: nothing to load
            store.mkdir()
            recomputed = await _text(token_engine, _request(token_engine, prompt, "d2"))
            after_recompute = _prompt_sources(token_engine)
        finally:
            await token_engine.shutdown()
        return split, recomputed, prompt_tokens, after_split, after_recompute

    split, recomputed, prompt_tokens, (computed, loaded), (computed2, loaded2) = asyncio.run(run())
    # vLLM's own prompt-token accounting (iteration stats): the split run LOADED the
    # prompt's KV (ExampleConnector loads whole blocks, leaving the last token or two to
    # compute) and computed only the rest; with the KV gone nothing was loaded and the
    # whole prompt was computed.
    # ExampleConnector stores a prompt under its first (n-1)//B*B tokens but looks it up
    # under (n-2)//B*B: a prompt of n = k*B+1 tokens is never found and is recomputed
    # (correct, just not transferred). This prompt is not such a length.
    assert prompt_tokens > 3 * BLOCK_TOKENS and prompt_tokens % BLOCK_TOKENS != 1
    assert loaded % BLOCK_TOKENS == 0 and prompt_tokens - 2 * BLOCK_TOKENS < loaded < prompt_tokens
    assert computed == prompt_tokens - loaded
    assert (loaded2 - loaded, computed2 - computed) == (0, prompt_tokens)
    reference = make_reference(tiny_model, prompt)
    assert split == recomputed == reference


def _prompt_sources(engine) -> tuple[int, int]:
    """(prompt tokens computed, prompt tokens loaded by the KV connector) so far."""
    snap = engine.tracker.snapshot
    return snap.prompt_tokens_computed, snap.prompt_tokens_kv_transfer


def make_reference(model: Path, prompt: str) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).decode(hf_greedy(model, prompt, 24))


@pytest.fixture(scope="module")
def prompt_engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model, enable_prefix_caching=False,
                                                       kv_transfer={"role": "kv_producer"}))


@pytest.fixture(scope="module")
def token_engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VllmEngine]:
    yield from running_engine(loop, tiny_engine_config(tiny_model, enable_prefix_caching=False,
                                                       kv_transfer={"role": "kv_consumer"}))


def _prompt_with(engine: VllmEngine, residue: int) -> str:
    """A docstring prefix of more than 3 blocks whose token count is residue mod the block size."""
    text = stdlib_docstrings()[4]
    for chars in range(400, len(text)):
        n = engine.count_tokens(text[:chars])
        if n > 3 * BLOCK_TOKENS and n % BLOCK_TOKENS == residue:
            return text[:chars]
    raise AssertionError(f"no prefix with {residue} tokens mod {BLOCK_TOKENS}")


def _block_files(engine: VllmEngine) -> list[str]:
    return os.listdir(engine.blocks.directory)


# residue 1: k blocks + 1 token, the length ExampleConnector never finds again.
@pytest.mark.parametrize("residue", [1, 0, 17])
def test_prompt_blocks_move_to_another_engine_losslessly(prompt_engine: VllmEngine, token_engine: VllmEngine,
                                                         tiny_model: Path, loop: asyncio.AbstractEventLoop,
                                                         residue: int) -> None:
    prompt = _prompt_with(prompt_engine, residue)
    n = prompt_engine.count_tokens(prompt)

    async def run() -> tuple:
        blocks = await prompt_engine.export_prompt_kv(_request(prompt_engine, prompt, f"p{residue}"), timeout_s=10)
        left_behind = _block_files(prompt_engine)
        before = _prompt_sources(token_engine)
        keys = token_engine.import_kv(blocks)
        text = await _text(token_engine, _request(token_engine, prompt, f"d{residue}"))
        after = _prompt_sources(token_engine)
        token_engine.release_kv(keys)
        return blocks, left_behind, before, after, text

    blocks, left_behind, (computed0, loaded0), (computed1, loaded1), text = loop.run_until_complete(run())
    assert len(blocks) == n // BLOCK_TOKENS, "every full block of the prompt, one file each (TP 1)"
    assert left_behind == [], "exported blocks leave the prompt engine's node with the payload"
    # All full blocks but a prompt's last token (which yields the first token's logits).
    loaded = loaded1 - loaded0
    assert loaded == (n - 1) // BLOCK_TOKENS * BLOCK_TOKENS and computed1 - computed0 == n - loaded
    assert _block_files(token_engine) == [], "released blocks are removed"
    assert text == make_reference(tiny_model, prompt)


def test_missing_or_damaged_blocks_are_recomputed(prompt_engine: VllmEngine, token_engine: VllmEngine,
                                                  tiny_model: Path, loop: asyncio.AbstractEventLoop) -> None:
    """A block of the wrong shape (from an engine of another TP, say) is refused and vLLM
    recomputes it; a right-shaped block of noise shows the answer depends on that block."""
    prompt = _prompt_with(prompt_engine, 5)
    n = prompt_engine.count_tokens(prompt)
    ids = prompt_engine.tokenizer.encode(prompt)
    second = os.path.basename(block_file("", block_keys(ids, BLOCK_TOKENS, len(ids))[1], 0))
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    damages = {
        "noise": lambda t: torch.randn_like(t) * 3 * t.std(),
        "wrong shape": lambda t: t[:, :1].contiguous(),  # half the KV heads
    }

    async def decode(damage: str) -> str:
        blocks = await prompt_engine.export_prompt_kv(_request(prompt_engine, prompt, f"p-{damage}"), timeout_s=10)
        blocks[second] = safetensors.torch.save({k: damages[damage](t) for k, t in
                                                 safetensors.torch.load(blocks[second]).items()})
        keys = token_engine.import_kv(blocks)
        try:
            return await _text(token_engine, _request(token_engine, prompt, f"d-{damage}"))
        finally:
            token_engine.release_kv(keys)

    async def run() -> tuple:
        texts = {damage: await decode(damage) for damage in damages}
        before = _prompt_sources(token_engine)
        missing = await _text(token_engine, _request(token_engine, prompt, "d-missing"))
        return texts, before, _prompt_sources(token_engine), missing

    texts, (c0, l0), (c1, l1), missing = loop.run_until_complete(run())
    reference = make_reference(tiny_model, prompt)
    assert texts["noise"] != reference, "the answer depends on the second block's KV"
    assert texts["wrong shape"] == reference, "the refused block was recomputed"
    assert missing == reference
    assert (l1 - l0, c1 - c0) == (0, n), "nothing to load: the whole prompt is computed"


def test_a_tensor_parallel_engine_writes_and_loads_each_ranks_share(tiny_model: Path) -> None:
    """TP 2 (vLLM's multiprocessing executor, a core per rank): each rank writes and loads
    its own half of every block (one KV head of the two). One engine on both sides of the
    hand-off (kv_both, a mixed replica's role): blocks between two engines are moved at TP 1
    above, and a second TP 2 engine cost ~75 s of CPU on a 2-core CI machine."""
    prompt = stdlib_docstrings()[4][:700]

    async def run() -> tuple:
        engine = make_engine(tiny_engine_config(tiny_model, enable_prefix_caching=False, tensor_parallel=2,
                                                distributed_executor_backend="mp", kv_transfer={"role": "kv_both"}))
        try:
            blocks = await engine.export_prompt_kv(_request(engine, prompt, "p-tp2"), timeout_s=30)
            assert blocks is not None, "the engine wrote no blocks within 30 s"
            before = _prompt_sources(engine)
            engine.import_kv(blocks)  # the export's files were removed once read: only these load
            text = await _text(engine, _request(engine, prompt, "d-tp2"))
            return blocks, before, _prompt_sources(engine), text, engine.count_tokens(prompt)
        finally:
            await engine.shutdown()

    blocks, (computed0, loaded0), (computed1, loaded1), text, n = asyncio.run(run())
    assert len(blocks) == 2 * (n // BLOCK_TOKENS), "a file per block and rank"
    shapes = {tuple(t.shape) for data in blocks.values() for t in safetensors.torch.load(data).values()}
    assert shapes == {(1, BLOCK_TOKENS, 2 * 64)}, "each rank holds one of the two KV heads"
    loaded, computed = loaded1 - loaded0, computed1 - computed0
    assert loaded == (n - 1) // BLOCK_TOKENS * BLOCK_TOKENS and computed == n - loaded
    assert text == make_reference(tiny_model, prompt)
