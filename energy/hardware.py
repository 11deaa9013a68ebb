"""GPU and model specifications the performance/power model is built from.

Power at max clock is Splitwise's simulator config (per GPU: prompt and token phase); the
floor is DynamoLLM's measured loaded-idle H100; clock ranges are DynamoLLM's (0.8-2.0 GHz on
H100). The clock physics are fitted by energy.clock_fit and the TP law by energy.tp_scaling;
`wattwise bench model-check --refit` fits them again and prints the values to paste here (a
unit test checks they still give the model-check figures). HBM bandwidth is the datasheet
peak; the ML.ENERGY profiles use it to cost KV-cache reads and to split a step's fixed part
into weight streaming and overhead.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class GpuSpec(BaseModel):
    """A GPU's limits and its clock and TP physics (energy.perf_model); the physics fields are
    fitted on measurements by energy.clock_fit, which says which cells each was fitted on."""

    model_config = ConfigDict(frozen=True)

    name: str
    memory_gib: float = Field(gt=0)
    min_clock_mhz: int = Field(gt=0)
    max_clock_mhz: int = Field(gt=0)
    clock_step_mhz: int = Field(default=15, gt=0)
    idle_w: float = Field(gt=0, description=(
        "Power of one GPU holding a replica's weights with no step running (the floor every "
        "replica draws; the GPUs also draw it through each step's overhead)."))
    prompt_w: float = Field(gt=0, description="Power of one GPU while prefilling at max clock.")
    token_w: float = Field(gt=0, description=(
        "Power of one GPU while decoding at max clock, where a profile has no measured curve."))
    prompt_core_power_share: float = Field(default=0.9, ge=0, le=1, description=(
        "Share of the above-floor prefill power drawn by the clocked core (the rest: HBM, uncore)."))
    token_core_power_share: float = Field(default=0.5, ge=0, le=1, description=(
        "Share of the above-floor decode power drawn by the clocked core."))
    voltage_knee: float = Field(default=0.6, gt=0, le=1, description=(
        "Clock (share of max) below which the core voltage stays at voltage_floor."))
    voltage_floor: float = Field(default=0.6, gt=0, le=1, description=(
        "Core voltage at and below the knee, relative to max clock's."))
    prompt_compute_share: float = Field(default=0.85, ge=0, le=1, description=(
        "Share of a prefill's work (not its overhead) that is compute-bound at max clock."))
    token_compute_share: float = Field(default=0.3, ge=0, le=1, description=(
        "Share of a decode step's work that is compute-bound at max clock."))
    roofline_sharpness: float = Field(default=1.0, ge=1, description=(
        "How sharply decode work turns compute-bound as the clock falls: 1 adds the memory and "
        "compute parts; large values approach a roofline (flat, then 1/clock)."))
    hbm_efficiency: float = Field(default=0.85, gt=0, le=1, description=(
        "Share of hbm_tb_per_s a decode step's weight read sustains; the rest of the step's "
        "fixed part is overhead."))
    tp_comm_ms_per_doubling: float = Field(default=1.4, ge=0, description=(
        "Overhead a decode step gains per doubling of TP (all-reduce latency), for the TPs a "
        "profile did not measure."))
    tp_power_ratio_per_doubling: float = Field(default=0.74, gt=0, le=1, description=(
        "Above-floor power per GPU at twice the TP and the same batch, relative to before."))
    price_per_hour: float = Field(default=2.5, ge=0)
    hbm_tb_per_s: float | None = Field(default=None, gt=0)
    peak_tflops: float | None = Field(default=None, gt=0, description=(
        "Dense BF16 tensor-core peak (datasheet), to cost a model's compute from first principles."))

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
    # idle_w: DynamoLLM §III measured 8 idle H100s at 550 W and 880 W once Llama2-70B was loaded
    # (110 W each: the floor of a replica). The clock and TP physics: energy.clock_fit (DynamoLLM
    # Tables I-II) and energy.tp_scaling (ML.ENERGY's TP1/TP2 pairs); `wattwise bench
    # model-check --refit` prints them again.
    "h100-80gb": GpuSpec(
        name="h100-80gb", memory_gib=80, min_clock_mhz=800, max_clock_mhz=1980,
        idle_w=110, prompt_w=700, token_w=380, price_per_hour=4.0, hbm_tb_per_s=3.35, peak_tflops=989,
        token_compute_share=0.4071, roofline_sharpness=12.6253, prompt_compute_share=0.5,
        prompt_core_power_share=0.723, voltage_floor=0.5501, token_core_power_share=0.137, voltage_knee=0.6237,
        tp_comm_ms_per_doubling=2.39, tp_power_ratio_per_doubling=0.746,
    ),
    # Idle: Splitwise's 63 W raised by H100's loaded/unloaded ratio (110/69). Clock physics:
    # H100's fit, except the compute share and knee, fitted on throttLL'eM's Fig. 2 (energy.clock_fit).
    "a100-80gb": GpuSpec(
        name="a100-80gb", memory_gib=80, min_clock_mhz=210, max_clock_mhz=1410,
        idle_w=100, prompt_w=400, token_w=250, price_per_hour=2.0, hbm_tb_per_s=2.04, peak_tflops=312,
        token_compute_share=0.4071, roofline_sharpness=12.6253, prompt_compute_share=0.5,
        prompt_core_power_share=0.723, voltage_floor=0.5501, token_core_power_share=0.6233, voltage_knee=0.7976,
        tp_comm_ms_per_doubling=2.39, tp_power_ratio_per_doubling=0.746,
    ),
    # DGX B200 (1000 W TDP). Not in Splitwise: idle (H100's loaded floor as a share of TDP) and the
    # lower clock are assumed; token_w is ML.ENERGY's Llama-70B decode power at batch >= 128. Only
    # the ML.ENERGY profiles use it, and their decode power is a measured curve over batch. Its
    # clock physics are H100's (no measurement of B200 clocks is public here).
    "b200-180gb": GpuSpec(
        name="b200-180gb", memory_gib=179, min_clock_mhz=800, max_clock_mhz=1965,
        idle_w=157, prompt_w=1000, token_w=950, price_per_hour=6.0, hbm_tb_per_s=8.0, peak_tflops=2250,
        token_compute_share=0.4071, roofline_sharpness=12.6253, prompt_compute_share=0.5,
        prompt_core_power_share=0.723, voltage_floor=0.5501, token_core_power_share=0.137, voltage_knee=0.6237,
        tp_comm_ms_per_doubling=2.39, tp_power_ratio_per_doubling=0.746,
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
    # throttLL'eM's characterisation model (its Fig. 2, A100 TP2): 40 layers, multi-head attention.
    "llama2-13b": ModelSpec(
        name="llama2-13b", params_b=13.0, layers=40, kv_heads=40, head_dim=128, hidden=5120,
        max_context_tokens=4096,
    ),
    "llama3.1-8b": ModelSpec(
        name="llama3.1-8b", params_b=8.03, layers=32, kv_heads=8, head_dim=128, hidden=4096,
        max_context_tokens=131072,
    ),
}
