"""A tiny Llama made offline, for tests and benchmarks of the real (vLLM) engine.

No model hub is reachable here, so the model is built from text every machine has:
CPython's own docstrings train a byte-level BPE tokenizer and a 2-layer Llama for a
hundred steps (loss 4.65; 300 steps gave 3.88 for three times the ~70 CPU-seconds),
enough that greedy output is peaked and checkable against an HF reference: every vLLM
test's comparison holds at either. Deterministic for a given seed; ~5 MB on disk.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

VOCAB_SIZE = 512
SEQ_TOKENS = 128
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]


def stdlib_docstrings(max_chars: int = 2_000_000) -> list[str]:
    """Docstrings of the standard library's modules, functions and classes, in file order."""
    out: list[str] = []
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    out.append(doc)
                    total += len(doc)
        if total >= max_chars:
            break
    return out


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: Path, steps: int = 100, seed: int = 0) -> Path:
    """Train and save the tokenizer and model into `out_dir` (returned)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    texts = stdlib_docstrings()
    tokenizer = _train_tokenizer(texts)
    ids = torch.tensor(tokenizer("\n\n".join(texts))["input_ids"])
    windows = ids[: len(ids) // SEQ_TOKENS * SEQ_TOKENS].view(-1, SEQ_TOKENS)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (16,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "final_loss.txt").write_text(f"{loss.item():.4f}\n")
    return out_dir


def tiny_engine_config(model_dir: Path, **overrides) -> dict:
    """The vLLM engine config tests and benchmarks run it with: fp32 (bf16 is ~3x slower
    on AVX2), eager (no 45-60 s compile per start), worker in the engine process."""
    return {"kind": "vllm", "model": str(model_dir), "dtype": "float32", "enforce_eager": True,
            "max_model_len": 1024, "block_size": 32, "distributed_executor_backend": "uni", **overrides}


if __name__ == "__main__":
    import sys

    print(build_tiny_model(Path(sys.argv[1])))
