"""A TP replica finds its workers' GPUs in its placement group, in a real local Ray (no GPU,
no vLLM needed: 4 logical GPUs). The options a vLLM pool's replicas ask Serve for are
tests/unit/deployments/test_vllm_placement.py."""

from __future__ import annotations


def test_a_tp_replica_finds_its_workers_gpus_in_its_placement_group() -> None:
    """A TP replica sits in the CPU bundle and sees no GPU; its clock and energy control
    need the GPUs of its group's GPU bundles, which vLLM's workers then run on (a real
    local Ray with 4 logical GPUs: Ray assigns their ids as it would physical ones)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from engines.vllm_placement import held_gpu_ids
    from tests.local_ray import init_local_ray

    @ray.remote(num_cpus=0, num_gpus=1)
    class Worker:  # what vLLM's Ray executor starts in each GPU bundle
        def gpus(self) -> list[int]:
            return [int(g) for g in ray.get_gpu_ids()]

    # A cluster of its own even where another Ray still runs (an earlier module's that was
    # still stopping made a plain ray.init() connect to it and refuse num_gpus, in CI).
    init_local_ray(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        groups = [placement_group([{"CPU": 0.01}, {"GPU": 1}, {"GPU": 1}], strategy="STRICT_PACK") for _ in range(2)]
        ray.get([g.ready() for g in groups])
        first, second = (held_gpu_ids(g) for g in groups)
        assert len(first) == len(second) == 2 and set(first).isdisjoint(second) and {*first, *second} == {0, 1, 2, 3}
        assert held_gpu_ids(groups[0]) == first, "a bundle keeps its GPU"
        workers = [Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            groups[0], placement_group_bundle_index=i)).remote() for i in (1, 2)]
        assert sorted(g for w in workers for g in ray.get(w.gpus.remote())) == first
    finally:
        ray.shutdown()
