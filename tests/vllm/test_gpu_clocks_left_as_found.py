"""GPUs left as found (issue 69 item 2), on a real Ray cluster with a fake NVML: a vLLM pool
replica (the tiny offline model on the CPU, holding one of two logical GPUs) locks its GPU's
clock through the node's GPU-control actor, and each way the replica or the actor goes puts the
locked GPU back at the driver's default: a graceful stop (a redeploy), SIGKILL of the replica
(its lease lapses), a kill of the actor (restarted, it resets what no live replica claims) and
`serve shutdown` (the CLI reaches `serve.shutdown()` through the dashboard, which the test's
cluster runs without: the test calls it). Each reset is checked by why the actor made it
(released, or a lapsed lease and whose), not only by the clock it left.

One cluster and one app for the module (each replica start loads vLLM: ~10-20 s here); the
cases run in order, each from the state the last left. The fake NVML keeps its devices' state in
a file, so the GPUs outlive the actor's process as real ones do, and the test reads them.
The clock is an operator's pin (the plan store's override), so a case decides when a replica
locks: a replacement replica started with no pin in force locks nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import serve

from deployments.builder import ReplicaDeployment
from deployments.gpu_actor import LEASE_S, NAMESPACE, GpuControlActor
from deployments.plan_store import plan_store
from energy.gpu_control import NvmlGpu
from energy.leased_clocks import BEFORE_START, LAPSED, RELEASED
from tests.fake_nvml import FakeNvml
from tests.live_app import wait_for
from tests.local_ray import init_local_ray
from tests.tiny_model_fixture import require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.tiny_model import tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()  # before the cluster starts: its workers take the vLLM environment this sets

APP = "clocks"
POOL = "pool-clock"
PIN_MHZ = 1200  # a clock the fake NVML supports
DEADLINE_S = 180.0  # a replica start or a lapse plus a check, on a busy machine: far more than either


@dataclass
class Cluster:
    nvml: FakeNvml  # the driver's window on the devices (the same state file as the actor's)
    node_id: str
    engine: dict[str, Any]

    def actor(self) -> Any:
        return ray.get_actor(f"gpu-control-{self.node_id}", namespace=NAMESPACE)

    def deploy(self, num_cpus: float) -> None:
        """The pool's one replica (a new `num_cpus` replaces the running one: a redeploy)."""
        serve.run(ReplicaDeployment.options(
            name=POOL, num_replicas=1, health_check_period_s=1.0,  # its first check starts its clock loop
            ray_actor_options={"num_cpus": num_cpus, "num_gpus": 1},
        ).bind("clock", self.engine, 0.05, None), name=APP, route_prefix=None)

    def pin(self, clock_mhz: int | None) -> None:
        ray.get(plan_store(APP).override.remote("clock_mhz", POOL, clock_mhz), timeout=60)

    def holders(self) -> dict[int, str]:
        try:
            return ray.get(self.actor().holders.remote(), timeout=30)
        except ray.exceptions.RayError:  # restarting
            return {}

    def resets(self) -> list[tuple[int, str]]:
        """(GPU, why) of each reset the actor (this life of it) made."""
        try:
            changes = ray.get(self.actor().changes.remote(), timeout=30)
        except ray.exceptions.RayError:
            return []
        return [(index, note) for _, index, _, _, note in changes if note.startswith("reset to default (")]

    def locked_by_a_replica(self) -> tuple[int, str]:
        """The GPU the pool's replica holds locked at the pin, and the replica, once it does."""
        found: list[tuple[int, str]] = []

        def locked() -> bool:
            found[:] = [(gpu, holder) for gpu, holder in self.holders().items()
                        if holder != BEFORE_START and self.nvml.locked().get(gpu) == PIN_MHZ]
            return len(found) == 1

        wait_for(locked, DEADLINE_S, f"the replica to lock its GPU at {PIN_MHZ} MHz", poll_s=0.5)
        return found[0]


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    init_local_ray(num_cpus=2, num_gpus=2, include_dashboard=False, namespace="gpu-clocks-test")
    state = tmp_path_factory.mktemp("fake-nvml") / "devices.json"
    node_id = ray.get_runtime_context().get_node_id()
    devices = NvmlGpu(FakeNvml(count=2, state_path=state))
    actor = GpuControlActor.options(name=f"gpu-control-{node_id}", namespace=NAMESPACE,
                                    lifetime="detached").remote("h100-80gb", gpus=devices)
    try:
        assert ray.get(actor.backend.remote(), timeout=120) == "nvml"
        serve.start(proxy_location="Disabled")
        live = Cluster(FakeNvml(count=2, state_path=state), node_id,
                       tiny_engine_config(tiny_model, device="gpu", batch_limit=2))
        live.deploy(num_cpus=0.5)
        yield live
    finally:
        serve.shutdown()
        ray.kill(actor)
        ray.shutdown()


def test_a_replica_stopped_gracefully_releases_its_gpu_at_once(cluster: Cluster) -> None:
    cluster.pin(PIN_MHZ)
    gpu, first = cluster.locked_by_a_replica()
    cluster.deploy(num_cpus=0.4)  # a redeploy: Serve stops the replica gracefully and starts another
    wait_for(lambda: (gpu, f"reset to default ({RELEASED} by {first})") in cluster.resets(), DEADLINE_S,
             "the stopped replica to release its GPU", poll_s=0.5)
    _gpu, second = cluster.locked_by_a_replica()  # the pin holds: its successor locks its own
    assert second != first


def test_a_killed_replicas_lease_lapses_and_its_gpu_is_reset(cluster: Cluster) -> None:
    gpu, replica = cluster.locked_by_a_replica()
    cluster.pin(None)  # the replica keeps its clock; the replacement Serve starts will lock none
    pid = ray.get(ray.get_actor(f"SERVE_REPLICA::{APP}#{POOL}#{replica}", namespace="serve")
                  .__ray_call__.remote(lambda _self: os.getpid()), timeout=30)
    os.kill(pid, signal.SIGKILL)  # no cleanup: only the lease can reset the GPU
    wait_for(lambda: (gpu, f"reset to default ({LAPSED} by {replica})") in cluster.resets(), DEADLINE_S,
             f"the lease ({LEASE_S:.0f} s) to lapse", poll_s=0.5)
    assert cluster.nvml.locked() == {}


def test_a_restarted_actor_resets_what_no_live_replica_claims(cluster: Cluster) -> None:
    cluster.pin(PIN_MHZ)
    gpu, replica = cluster.locked_by_a_replica()
    orphan = 1 - gpu
    cluster.nvml.lock_outside(orphan, 990)  # a clock a replica of the dead actor's time left locked
    assert orphan not in cluster.holders()  # its first life's start lease lapsed long ago
    ray.kill(cluster.actor(), no_restart=False)  # Ray restarts it (max_restarts=-1)
    # Its second life holds every GPU on its start's lease until a live replica claims its own.
    wait_for(lambda: cluster.holders().get(orphan) == BEFORE_START, DEADLINE_S, "the actor to restart", poll_s=0.2)
    wait_for(lambda: (orphan, f"reset to default ({LAPSED} by {BEFORE_START})") in cluster.resets(), DEADLINE_S,
             "the restarted actor to reset the orphaned GPU", poll_s=0.5)
    # The live replica renewed its claim within the start's lease: its GPU kept its clock.
    assert cluster.nvml.locked() == {gpu: PIN_MHZ} and cluster.holders() == {gpu: replica}


def test_serve_shutdown_releases_every_gpu(cluster: Cluster) -> None:
    gpu, replica = cluster.locked_by_a_replica()
    serve.shutdown()
    wait_for(lambda: (gpu, f"reset to default ({RELEASED} by {replica})") in cluster.resets(), DEADLINE_S,
             "serve shutdown to release the replica's GPU", poll_s=0.5)
    assert cluster.nvml.locked() == {} and cluster.holders() == {}
