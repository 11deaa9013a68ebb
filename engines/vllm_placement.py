"""Which Ray resources a pool's replica asks Serve for, from its engine config.

A vLLM replica with tensor parallelism runs its workers as Ray actors (vLLM's Ray
executor); they must sit on GPUs of one node that Serve reserved for this replica, so
the replica asks for a placement group: one bundle for itself (CPU), one GPU bundle per
TP rank, packed on one node (STRICT_PACK). The engine hands that group to vLLM
(engines.vllm_engine). TP1 on a GPU needs no group: the replica holds the GPU itself.
Simulated and CPU engines need only CPU.
"""

from __future__ import annotations

import os
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


def held_gpu_ids(placement_group: Any | None, timeout_s: float = 60.0) -> list[int]:
    """The GPUs (Ray's ids, which NVML indexes alike on a node) a replica's engine runs on,
    for its clock and energy control.

    Without a placement group the replica holds them itself and Ray lists them in
    CUDA_VISIBLE_DEVICES. With one (TP > 1 through vLLM's Ray executor) the replica sits
    in the CPU bundle and vLLM's workers in the GPU bundles, so the replica sees no GPU:
    a zero-CPU task in each GPU bundle asks which GPU it holds. A bundle keeps the GPUs
    reserved for it, so this must run before vLLM's workers take them, and the answer
    holds for as long as the group lives."""
    if placement_group is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [int(i) for i in visible.split(",") if i.strip().isdigit()]
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    def gpus_here() -> list[int] | list[str]:
        return ray.get_gpu_ids()

    probes = [
        gpus_here.options(num_gpus=bundle["GPU"], scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=i)).remote()
        for i, bundle in enumerate(placement_group.bundle_specs) if bundle.get("GPU")
    ]
    return sorted(int(g) for ids in ray.get(probes, timeout=timeout_s) for g in ids)
