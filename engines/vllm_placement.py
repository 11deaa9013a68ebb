"""Which Ray resources a pool's replica asks Serve for, from its engine config.

A vLLM replica with tensor parallelism runs its workers as Ray actors (vLLM's Ray
executor); they must sit on GPUs of one node that Serve reserved for this replica, so
the replica asks for a placement group: one bundle for itself (CPU), one GPU bundle per
TP rank, packed on one node (STRICT_PACK). The engine hands that group to vLLM
(engines.vllm_engine). TP1 on a GPU needs no group: the replica holds the GPU itself.
Simulated and CPU engines need only CPU.
"""

from __future__ import annotations

from typing import Any

from engines.vllm_config import VllmEngineConfig

# Ray refuses a bundle whose resources are all zero; a replica configured with
# num_cpus: 0 still gets a (negligible) bundle of its own.
MIN_BUNDLE_CPUS = 0.01


def replica_resources(engine: Any, num_cpus: float) -> dict[str, Any]:
    """Serve deployment options (ray_actor_options, placement group) for one replica."""
    actor = {"num_cpus": num_cpus}
    if not isinstance(engine, VllmEngineConfig):
        return {"ray_actor_options": actor}
    if engine.executor_backend == "ray":
        gpus = engine.tensor_parallel if engine.device == "gpu" else 0
        workers = [{"GPU": 1}] * gpus if gpus else [{"CPU": 1}] * engine.tensor_parallel
        return {
            "ray_actor_options": actor,
            "placement_group_bundles": [{"CPU": max(num_cpus, MIN_BUNDLE_CPUS)}, *workers],
            "placement_group_strategy": "STRICT_PACK",
        }
    if engine.device == "gpu":
        return {"ray_actor_options": {**actor, "num_gpus": engine.tensor_parallel}}
    return {"ray_actor_options": actor}
