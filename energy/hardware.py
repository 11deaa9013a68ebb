"""GPU and model specifications the performance/power model is built from.

Power figures are Splitwise's simulator config (per GPU: idle, prompt phase, token
phase at max clock); clock ranges are DynamoLLM's (0.8-2.0 GHz on H100). HBM bandwidth
is the datasheet peak; the ML.ENERGY profiles (energy.mlenergy_calibration) use it to cost
KV-cache reads, which their batch sweeps cannot separate from per-sequence work.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class GpuSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    memory_gib: float = Field(gt=0)
    min_clock_mhz: int = Field(gt=0)
    max_clock_mhz: int = Field(gt=0)
    clock_step_mhz: int = Field(default=15, gt=0)
    idle_w: float = Field(gt=0)
    prompt_w: float = Field(gt=0)  # per GPU while prefilling at max clock
    token_w: float = Field(gt=0)  # per GPU while decoding at max clock
    # Share of the above-idle power drawn by the clocked core (the rest: HBM, uncore).
    prompt_core_power_share: float = Field(default=0.9, ge=0, le=1)
    token_core_power_share: float = Field(default=0.5, ge=0, le=1)
    # Below this fraction of max clock the voltage stays at its floor (DVFS knee), so
    # core power falls linearly with clock below it and cubically above it.
    voltage_knee: float = Field(default=0.6, gt=0, le=1)
    # Share of prefill / decode time that is compute-bound (scales with 1/clock).
    prompt_compute_share: float = Field(default=0.85, ge=0, le=1)
    token_compute_share: float = Field(default=0.3, ge=0, le=1)
    price_per_hour: float = Field(default=2.5, ge=0)
    hbm_tb_per_s: float | None = Field(default=None, gt=0)

    def supported_clocks_mhz(self) -> list[int]:
        clocks = list(range(self.min_clock_mhz, self.max_clock_mhz, self.clock_step_mhz))
        return [*clocks, self.max_clock_mhz]


class ModelSpec(BaseModel):
    """Enough of an LLM's architecture to size weights and the KV cache."""

    model_config = ConfigDict(frozen=True)

    name: str
    params_b: float = Field(gt=0)
    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    hidden: int = Field(gt=0)
    dtype_bytes: int = Field(default=2, gt=0)
    max_context_tokens: int = Field(default=8192, gt=0)

    @classmethod
    def from_hf_config(cls, model_dir: str | Path) -> ModelSpec:
        """The spec of a model a vLLM replica serves, from its Hugging Face config.json
        (decoder-only, Llama-style: attention + gated MLP), so a profile measured on that
        engine is sized for the model itself, not for one of the built-in ones."""
        path = Path(model_dir).expanduser() / "config.json"
        try:
            cfg = json.loads(path.read_text())
            hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or hidden // heads)
            mlp, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{path}: cannot read the model's architecture ({exc!r})") from exc
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
        params = layers * (attention + 3 * hidden * mlp + 2 * hidden) + hidden + vocab * hidden * (
            1 if cfg.get("tie_word_embeddings") else 2)
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return cls(name=Path(model_dir).name, params_b=params / 1e9, layers=layers, kv_heads=kv_heads,
                   head_dim=head_dim, hidden=hidden, dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
                   max_context_tokens=int(cfg.get("max_position_embeddings") or 8192))

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def kv_capacity_tokens(self, gpu: GpuSpec, tp: int, memory_utilisation: float = 0.9) -> int:
        """Tokens of KV cache that fit on `tp` GPUs after the weights (0 if none fit)."""
        usable = gpu.memory_gib * 2**30 * tp * memory_utilisation - self.weight_bytes
        return max(int(usable // self.kv_bytes_per_token), 0)


GPUS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(
        name="h100-80gb", memory_gib=80, min_clock_mhz=800, max_clock_mhz=1980,
        idle_w=75, prompt_w=700, token_w=380, price_per_hour=4.0, hbm_tb_per_s=3.35,
    ),
    "a100-80gb": GpuSpec(
        name="a100-80gb", memory_gib=80, min_clock_mhz=600, max_clock_mhz=1410,
        idle_w=63, prompt_w=400, token_w=250, price_per_hour=2.0, hbm_tb_per_s=2.04,
    ),
    # DGX B200 (1000 W TDP). Not in Splitwise: idle (H100's share of TDP) and the lower clock
    # are assumed; token_w is ML.ENERGY's Llama-70B decode power at batch >= 128. Only the
    # ML.ENERGY profiles use it, and their decode power is a measured curve over batch.
    "b200-180gb": GpuSpec(
        name="b200-180gb", memory_gib=179, min_clock_mhz=800, max_clock_mhz=1965,
        idle_w=110, prompt_w=1000, token_w=950, price_per_hour=6.0, hbm_tb_per_s=8.0,
    ),
}

MODELS: dict[str, ModelSpec] = {
    "llama2-70b": ModelSpec(
        name="llama2-70b", params_b=69.0, layers=80, kv_heads=8, head_dim=128, hidden=8192,
        max_context_tokens=8192,
    ),
    "bloom-176b": ModelSpec(
        name="bloom-176b", params_b=176.0, layers=70, kv_heads=112, head_dim=128, hidden=14336,
        max_context_tokens=8192,
    ),
    # Llama-3.1-70B and 3.3-70B share Llama-2-70B's shape (80 layers, hidden 8192, 8 KV
    # heads), so one ML.ENERGY profile sizes all three; only the context window differs.
    "llama3.1-70b": ModelSpec(
        name="llama3.1-70b", params_b=70.6, layers=80, kv_heads=8, head_dim=128, hidden=8192,
        max_context_tokens=131072,
    ),
    "llama3.1-8b": ModelSpec(
        name="llama3.1-8b", params_b=8.03, layers=32, kv_heads=8, head_dim=128, hidden=4096,
        max_context_tokens=131072,
    ),
}
