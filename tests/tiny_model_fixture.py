"""The tiny offline Llama (wattwise.tiny_model) for vLLM tests: built once per session
under pytest's base temp dir (several modules import this fixture; the directory is
the cache), and skipped with a reason where vLLM is not installed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wattwise.tiny_model import build_tiny_model

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def require_vllm() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[cpu]' (or '.[gpu]')")
    os.environ.update(VLLM_ENV)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm()
    path = tmp_path_factory.getbasetemp() / "tiny-llm"
    if not (path / "model.safetensors").exists():
        build_tiny_model(path)
    return path


def hf_greedy(model: Path, prompt: str, max_tokens: int) -> list[int]:
    """The reference: HF transformers' greedy continuation of `prompt`, token ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()
