"""The `splitwise:` block of serve_config.yaml: Splitwise's phase split in Ray Serve.

The scheduling knobs are the simulator's own (autoscaling.splitwise.config); the rest
say how the KV cache moves between a prompt and a token replica in Serve.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autoscaling.splitwise.config import MachineConfig, SplitwiseConfig
from engines.sim_engine import SimEngineConfig
from engines.vllm_config import VllmEngineConfig


class SplitwiseServeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scheduling: SplitwiseConfig = SplitwiseConfig()
    # The sim engine's KV payload is prompt_tokens x the model's KV bytes per token / TP
    # (energy.kv_transfer), times this factor, so local runs move kilobytes, not gigabytes.
    kv_payload_scale: float = Field(default=1e-3, gt=0, le=1)
    # The token replica waits this long for the KV, then recomputes the prompt itself.
    kv_transfer_timeout_s: float = Field(default=5.0, gt=0)
    # Failure injection: the share of transfers a prompt replica drops (tests, drills).
    transfer_failure_prob: float = Field(default=0.0, ge=0, le=1)
    # How often the coordinator polls the phase replicas' pending tokens.
    report_period_s: float = Field(default=0.5, gt=0)
    # False: assignments count only reported load (to measure herding without reservations).
    reservations: bool = True


_KV_ROLES = {"prompt": {"kv_producer", "kv_both"}, "token": {"kv_consumer", "kv_both"}, "mixed": {"kv_both"}}


def phase_engine(engine: SimEngineConfig | VllmEngineConfig, phase: str, scheduling: SplitwiseConfig,
                 where: str) -> SimEngineConfig | VllmEngineConfig:
    """A phase pool's engine: the sim engine gets its phase's batcher hooks (and a prompt
    pool the prompt token budget, §IV-B); a vLLM engine must be on its side of the KV connector."""
    if isinstance(engine, VllmEngineConfig):
        role = engine.kv_transfer.role if engine.kv_transfer else None
        if role not in _KV_ROLES[phase]:
            raise ValueError(f"{where}.kv_transfer.role: a {phase} pool needs one of {sorted(_KV_ROLES[phase])}, "
                             f"not {role!r}")
        return engine
    update: dict = {"splitwise": MachineConfig(phase=phase, scheduling=scheduling)}
    if phase == "prompt":
        update["max_batched_tokens"] = scheduling.prompt_batch_tokens
    return engine.model_copy(update=update)
