"""Which engine a pool runs, chosen by `engine.kind` in its config ("sim" when absent).

Existing configs name no kind and stay simulated; `kind: vllm` selects vLLM. The
union validates either shape, and `make_engine` builds the engine a replica runs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Discriminator, Tag, TypeAdapter

from energy.hardware import MODELS
from engines.modelled_engine_config import ModelledEngineConfig
from engines.protocol import Engine
from engines.vllm_config import VllmEngineConfig


def engine_kind(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("kind", "sim")
    return getattr(value, "kind", "sim")


def _drop_sim_kind(value: Any) -> Any:
    """ModelledEngineConfig forbids unknown keys: accept an explicit `kind: sim` anyway."""
    if isinstance(value, dict) and value.get("kind") == "sim":
        return {k: v for k, v in value.items() if k != "kind"}
    return value


EngineConfig = Annotated[
    Annotated[ModelledEngineConfig, Tag("sim")] | Annotated[VllmEngineConfig, Tag("vllm")],
    Discriminator(engine_kind),
    BeforeValidator(_drop_sim_kind),
]
_ADAPTER: TypeAdapter = TypeAdapter(EngineConfig)


def parse_engine_config(data: dict[str, Any]) -> ModelledEngineConfig | VllmEngineConfig:
    return _ADAPTER.validate_python(data)


def parse_vllm_engine_config(data: dict[str, Any]) -> VllmEngineConfig:
    """An engine config that must be vLLM's (`kind: vllm`)."""
    config = parse_engine_config(data)
    if not isinstance(config, VllmEngineConfig):
        raise ValueError(f"a vLLM engine config (kind: vllm) is needed, not kind {engine_kind(config)!r}")
    return config


def context_tokens(config: ModelledEngineConfig | VllmEngineConfig) -> int:
    """The longest prompt + output the pool's model takes."""
    if isinstance(config, VllmEngineConfig):
        return config.max_model_len
    return MODELS[config.model].max_context_tokens


def make_engine(data: dict[str, Any]) -> Engine:
    """The engine a replica runs. Each engine's module is imported here, by the replica that
    builds one: the config's readers (the app's config in every process) need neither vLLM
    nor the modelled engine's batcher and throttLL'eM model (scikit-learn, ~2 s of CPU a start)."""
    config = parse_engine_config(data)
    if isinstance(config, VllmEngineConfig):
        from engines.vllm_engine import VllmEngine

        return VllmEngine(config)
    from engines.modelled_engine import ModelledEngine

    return ModelledEngine(config)
