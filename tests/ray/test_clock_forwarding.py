"""A replica's clock target reaches its GPUs even when the GPU-control actor refuses it at
first, and the clock metric reports what the GPUs run at, not the target.

Real Ray: the node's detached GpuControlActor (modelled GPU here, no NVML) and the
replica's own `_forward_clock` loop against it. The actor is created with a 5 s rate
limit so the second change is certainly refused once, as a throttling replica's would be.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from core.stats import ReplicaStats
from deployments.gpu_actor import NAMESPACE, GpuControlActor, gpu_actor_for_this_node
from deployments.metrics import ReplicaMetrics
from deployments.replica import LLMReplica, ReplicaIdentity
from energy.hardware import GPUS
from tests.local_ray import init_local_ray

pytestmark = pytest.mark.ray
RATE_LIMIT_S = 5.0
DEADLINE_S = 60.0
LOW_MHZ, HIGH_MHZ = 1190, 1595  # supported H100 clocks: the governor locks them as asked
assert {LOW_MHZ, HIGH_MHZ} <= set(GPUS["h100-80gb"].supported_clocks_mhz())


@pytest.fixture(scope="module")
def actor() -> Iterator[Any]:
    init_local_ray(num_cpus=1, include_dashboard=False, namespace="clock-forwarding-test")
    node_id = ray.get_runtime_context().get_node_id()
    handle = GpuControlActor.options(name=f"gpu-control-{node_id}", namespace=NAMESPACE,
                                     lifetime="detached").remote("h100-80gb", RATE_LIMIT_S)
    assert ray.get(handle.backend.remote()) == "modelled"
    try:
        yield handle
    finally:
        ray.kill(handle)
        ray.shutdown()


class _Engine:
    """Only what _forward_clock reads: the engine's clock target and its GPU model."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(hardware="h100-80gb")
        self.clock_mhz = 0.0
        self.gpu_ids = [0]

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(clock_mhz=self.clock_mhz)

    def clock_applied(self, clock_mhz: float | None) -> None:
        pass


def _replica(engine: _Engine) -> LLMReplica:
    """The replica class on its own, given the stub engine (no Serve, no plan to follow)."""
    return LLMReplica("short", engine, ReplicaIdentity("app", "pool-short", "r0"))  # type: ignore[arg-type]


async def _until(check, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_refused_change_is_retried_and_the_applied_clock_is_reported(actor: Any) -> None:
    assert gpu_actor_for_this_node("h100-80gb")._actor_id == actor._actor_id  # the replica finds this one

    def clock_of_gpu() -> int:
        return ray.get(actor.clocks_mhz.remote([0]))[0]

    def refused(mhz: int) -> bool:
        return any(req == mhz and applied is None and note == "rate limited"
                   for _, _, req, applied, note in ray.get(actor.changes.remote()))

    async def scenario() -> None:
        engine = _Engine()
        replica = _replica(engine)
        task = asyncio.get_running_loop().create_task(replica._forward_clock(period_s=0.1))
        try:
            engine.clock_mhz = LOW_MHZ
            await _until(lambda: clock_of_gpu() == LOW_MHZ and replica.applied_clock_mhz == LOW_MHZ, "LOW locked")
            engine.clock_mhz = HIGH_MHZ  # within the actor's rate limit of the last change: refused
            await _until(lambda: refused(HIGH_MHZ), "the actor to refuse HIGH")
            # While refused, the replica reports what the GPU runs at, not its target.
            assert clock_of_gpu() == LOW_MHZ and replica.applied_clock_mhz == LOW_MHZ
            # ...and sends the target again until the actor takes it.
            await _until(lambda: clock_of_gpu() == HIGH_MHZ and replica.applied_clock_mhz == HIGH_MHZ, "HIGH locked")
        finally:
            task.cancel()

    asyncio.run(scenario())


class _Recorder:
    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values.append(value)


def test_clock_gauge_takes_the_applied_clock_and_never_the_target(actor: Any) -> None:
    metrics = ReplicaMetrics("short")
    metrics.clock, metrics.clock_target = _Recorder(), _Recorder()
    stats = ReplicaStats(clock_mhz=1200)
    metrics.record_stats(stats, 1980.0)  # e.g. after a fail-static reset to default clocks
    metrics.record_stats(stats, None)  # not read back yet: nothing reported as applied
    assert metrics.clock.values == [1980.0]
    assert metrics.clock_target.values == [1200, 1200]
