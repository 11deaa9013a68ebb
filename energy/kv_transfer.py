"""Time to move a prompt's KV cache from its prompt replica to its token replica.

Splitwise §IV-C: each of the TP GPUs sends its shard over its own link, so a prompt
of n tokens moves n x kv_bytes_per_token / TP bytes per link. Serialized transfer
starts after the prompt and delays the second token by all of it; layer-wise transfer
sends layer i while layer i+1 computes, leaving visible only the last layer's share
(or whatever the prompt's compute could not hide). Small prompts use serialized
transfer, whose cost is small and which avoids per-layer synchronisation (Fig. 14:
below 512 tokens on H100).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from energy.hardware import ModelSpec


class KVTransferConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    link_gbps: float = Field(default=400.0, gt=0, description=(
        "Bandwidth (Gbit/s) of each GPU's link; 400: InfiniBand per GPU on DGX-H100."))
    layerwise_min_prompt_tokens: int = Field(default=512, ge=0, description=(
        "Prompts of at least this many tokens move their KV layer-wise, smaller ones serialized "
        "(Splitwise Fig. 14: below 512 tokens on H100)."))


@dataclass(frozen=True)
class Transfer:
    layerwise: bool
    bytes_per_link: float
    visible_s: float  # delay it adds after the prompt's first token


class KVTransferModel:
    def __init__(self, model: ModelSpec, config: KVTransferConfig = KVTransferConfig()) -> None:
        self.model = model
        self.config = config

    def bytes_per_link(self, prompt_tokens: int, tp: int) -> float:
        return prompt_tokens * self.model.kv_bytes_per_token / tp

    def serialized_s(self, prompt_tokens: int, tp: int) -> float:
        return self.bytes_per_link(prompt_tokens, tp) * 8 / (self.config.link_gbps * 1e9)

    def layerwise_s(self, prompt_tokens: int, tp: int, prompt_compute_s: float) -> float:
        """The last layer's share, or the part the other layers' compute could not hide."""
        total = self.serialized_s(prompt_tokens, tp)
        layers = self.model.layers
        return max(total / layers, total - prompt_compute_s * (layers - 1) / layers)

    def plan(self, prompt_tokens: int, tp: int, prompt_compute_s: float) -> Transfer:
        layerwise = prompt_tokens >= self.config.layerwise_min_prompt_tokens
        visible = (self.layerwise_s(prompt_tokens, tp, prompt_compute_s) if layerwise
                   else self.serialized_s(prompt_tokens, tp))
        return Transfer(layerwise, self.bytes_per_link(prompt_tokens, tp), visible)
