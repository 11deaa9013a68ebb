"""A vLLM engine's LoRA adapters, by the names requests give as `model`: each is vLLM's
LoRARequest (its id fixed for the engine's life, so vLLM loads it once and keeps it)."""

from __future__ import annotations

from typing import Any

from core.request import Request
from engines.vllm_config import LoraAdapter


class LoraAdapters:
    def __init__(self, adapters: list[LoraAdapter]) -> None:
        from vllm.lora.request import LoRARequest

        self._requests = {a.name: LoRARequest(a.name, i + 1, a.path) for i, a in enumerate(adapters)}

    def lora(self, request: Request) -> Any:
        """The request's adapter (None: the base model); the ingress admits only served names."""
        if request.adapter is None:
            return None
        if request.adapter not in self._requests:
            raise ValueError(f"request {request.request_id}: no LoRA adapter {request.adapter!r} on this engine; "
                             f"it serves {sorted(self._requests)}")
        return self._requests[request.adapter]
