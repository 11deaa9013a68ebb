"""What a vLLM pool's replicas ask Serve for (no GPU, no Ray, no vLLM needed): the built
deployment's options, as `serve run` would submit them. tests/ray/test_vllm_placement.py
finds a TP replica's GPUs in a real placement group."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import AppConfig, PoolConfig
from deployments.builder import _pool_deployment


def _replica_options(engine: dict[str, Any], num_cpus: float = 1.0) -> tuple[dict, list | None, str | None]:
    pool = PoolConfig(name="p", classes=["SS"], engine=engine, num_cpus=num_cpus)
    deployment = _pool_deployment(pool, AppConfig.model_construct())._bound_deployment
    replica = deployment._replica_config
    return deployment.ray_actor_options, replica.placement_group_bundles, replica.placement_group_strategy


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_gpu_pool_reserves_one_node_of_gpus(tp: int) -> None:
    actor, bundles, strategy = _replica_options({"kind": "vllm", "model": "/m", "device": "gpu", "tensor_parallel": tp})
    assert actor == {"num_cpus": 1.0}  # the replica itself: no GPU, it fits the first bundle
    assert bundles == [{"CPU": 1.0}] + [{"GPU": 1}] * tp
    assert strategy == "STRICT_PACK"


def test_tp1_gpu_replica_holds_its_gpu_without_a_group() -> None:
    actor, bundles, strategy = _replica_options({"kind": "vllm", "model": "/m", "device": "gpu"})
    assert actor == {"num_cpus": 1.0, "num_gpus": 1} and bundles is None and strategy is None


def test_zero_cpu_replica_still_gets_a_valid_bundle() -> None:
    _, bundles, _ = _replica_options({"kind": "vllm", "model": "/m", "device": "gpu", "tensor_parallel": 2}, 0)
    assert bundles[0]["CPU"] > 0 and bundles[1:] == [{"GPU": 1}] * 2


@pytest.mark.parametrize("engine", [{"kind": "vllm", "model": "/m"}, {"tensor_parallel": 8}])
def test_cpu_vllm_and_simulated_pools_ask_for_cpu_only(engine: dict[str, Any]) -> None:
    actor, bundles, _ = _replica_options(engine, 0.5)
    assert actor == {"num_cpus": 0.5} and bundles is None


def test_cpu_tp_ranks_get_disjoint_cores_where_vllm_would_refuse() -> None:
    from engines.vllm_engine import cpu_threads_bind

    assert cpu_threads_bind(2, [0, 1]) == "0|1"
    assert cpu_threads_bind(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    with pytest.raises(ValueError, match="tensor_parallel: 3 CPU ranks need as many cores"):
        cpu_threads_bind(3, [0, 1])


def test_without_a_group_the_replica_holds_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.vllm_placement import held_gpu_ids

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert held_gpu_ids(None) == [3, 5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert held_gpu_ids(None) == []
