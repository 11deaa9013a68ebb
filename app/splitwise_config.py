"""The `splitwise:` block of serve_config.yaml: Splitwise's phase split in Ray Serve.

The scheduling knobs are the simulator's own (autoscaling.splitwise.config); the rest
say how the KV cache moves between a prompt and a token replica in Serve.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.splitwise.config import MachineConfig, SplitwiseConfig
from core.roles import Phase
from engines.modelled_engine_config import ModelledEngineConfig
from engines.vllm_config import VllmEngineConfig


class SplitwiseServeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scheduling: SplitwiseConfig = Field(default=SplitwiseConfig(), description=(
        "Splitwise's scheduling knobs, the simulator's own (autoscaling.splitwise.config)."))
    kv_payload_scale: float = Field(default=1e-3, gt=0, le=1, description=(
        "The modelled engine's KV payload is prompt_tokens x the model's KV bytes per token / TP "
        "(energy.kv_transfer), times this factor, so local runs move kilobytes, not gigabytes."))
    kv_transfer_timeout_s: float = Field(default=5.0, gt=0, description=(
        "The token replica waits this long (s) for the KV, then recomputes the prompt itself."))
    prompt_phase_timeout_s: float = Field(default=10.0, gt=0, description=(
        "How long (s) a request waits for its prompt phase (the prompt replica taking it and running the "
        "prompt) before its token replica runs it whole, prompt included, as Splitwise's mixed pool does. A "
        "prompt pool whose only replica was lost with its machine has none until another starts, and Serve "
        "would hold the request until then."))
    transfer_failure_prob: float = Field(default=0.0, ge=0, le=1, description=(
        "Failure injection: the share of KV transfers a prompt replica drops (tests, drills)."))
    report_period_s: float = Field(default=0.5, gt=0, description=(
        "How often (s) the coordinator polls the phase replicas' pending tokens."))
    reservations: bool = Field(default=True, description=(
        "Assignments also count the load reserved by assignments not yet reported; False: only "
        "reported load (to measure herding without reservations)."))


_KV_ROLES = {Phase.PROMPT: {"kv_producer", "kv_both"}, Phase.TOKEN: {"kv_consumer", "kv_both"},
             Phase.MIXED: {"kv_both"}}


def check_kv_compatible(engines: list[ModelledEngineConfig | VllmEngineConfig]) -> None:
    """Phase pools hand KV to each other: one engine kind and one connector, and with
    our block files (which hold each TP rank's share of a block) one TP and block size."""
    vllm = [e for e in engines if isinstance(e, VllmEngineConfig)]
    if not vllm:
        return
    if len(vllm) != len(engines):
        raise ValueError("pools: phase pools must all run vLLM or all the modelled engine (they hand KV to each other)")
    # phase_engine saw that each has a kv_transfer
    connectors = {e.kv_transfer.connector for e in vllm if e.kv_transfer is not None}
    if len(connectors) > 1:
        raise ValueError(f"pools: phase pools must use one KV connector, not {sorted(connectors)}")
    shapes = {(e.model, e.tensor_parallel, e.block_size) for e in vllm}
    first_kv = vllm[0].kv_transfer
    if len(shapes) > 1 and first_kv is not None and first_kv.block_files:
        raise ValueError("pools: with BlockFileKVConnector every phase pool needs the same model, tensor_parallel "
                         f"and block_size; (model, TP, block size) are {sorted(shapes, key=str)}")


def phase_engine(engine: ModelledEngineConfig | VllmEngineConfig, phase: Phase, scheduling: SplitwiseConfig,
                 where: str) -> ModelledEngineConfig | VllmEngineConfig:
    """A phase pool's engine: the modelled engine gets its phase's batcher hooks (and a prompt
    pool the prompt token budget, §IV-B); a vLLM engine must be on its side of the KV connector."""
    if isinstance(engine, VllmEngineConfig):
        role = engine.kv_transfer.role if engine.kv_transfer else None
        if role not in _KV_ROLES[phase]:
            raise ValueError(f"{where}.kv_transfer.role: a {phase} pool needs one of {sorted(_KV_ROLES[phase])}, "
                             f"not {role!r}")
        return engine
    update: dict = {"splitwise": MachineConfig(phase=phase, scheduling=scheduling)}
    if phase is Phase.PROMPT:
        update["max_batched_tokens"] = scheduling.prompt_batch_tokens
    return engine.model_copy(update=update)
