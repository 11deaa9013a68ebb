"""One privileged GPU-control actor per node: the only path from serving code to clocks.

Replicas ask it to lock clocks for their GPUs; it clamps, rate-limits and records
each change (energy.clock_governor), restores default clocks when it stops, and
falls back to the modelled GPU where NVML is missing (its `backend` says which).
"""

from __future__ import annotations

import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from core.overheads import OverheadTable
from energy.clock_governor import ClockGovernor
from energy.gpu_control import GpuControlError, open_gpus
from energy.hardware import GPUS

NAMESPACE = "wattwise"
# Replicas resend their target every forward period, so a GPU held at default clocks adds a
# refusal record each time: keep the newest records only.
MAX_HISTORY = 10_000


@ray.remote(num_cpus=0, max_restarts=-1)
class GpuControlActor:
    def __init__(self, hardware: str = "h100-80gb",
                 min_interval_s: float = OverheadTable().clock_forward_period_s) -> None:
        self.governor = ClockGovernor(open_gpus(GPUS[hardware]), min_interval_s)

    def backend(self) -> str:
        return self.governor.gpus.backend

    def set_clock(self, indices: list[int], clock_mhz: float) -> list[int | None]:
        """The clock each GPU was locked at, or None where the governor refused (rate limit,
        hold after an error) or NVML failed: the caller retries those later."""
        now = time.monotonic()
        applied = [self.governor.set_clock(i, clock_mhz, now) for i in indices]
        del self.governor.history[:-MAX_HISTORY]
        return applied

    def clocks_mhz(self, indices: list[int]) -> list[int | None]:
        """The clocks the GPUs run at, read back (NVML's graphics clock; the modelled GPU's
        locked clock, else its maximum): what dashboards show as applied, which differs from
        the replica's target while a change is refused or after a fail-static reset. None
        for a GPU that cannot be read."""
        out: list[int | None] = []
        for i in indices:
            try:
                out.append(self.governor.gpus.clock_mhz(i))
            except GpuControlError:
                out.append(None)
        return out

    def energy_j(self, indices: list[int]) -> float:
        """Energy of the GPUs that could be read; one that fails is reset to default clocks."""
        now = time.monotonic()
        readings = (self.governor.energy_j(i, now) for i in indices)
        return sum(j for j in readings if j is not None)

    def changes(self) -> list[tuple[float, int, int, int | None, str]]:
        return [(c.at_s, c.index, c.requested_mhz, c.applied_mhz, c.note) for c in self.governor.history]

    def restore_all(self) -> None:
        self.governor.restore_all(time.monotonic())

    def __del__(self) -> None:
        if "governor" in self.__dict__:  # Ray's actor-class proxy shares this method; skip it
            self.restore_all()


def gpu_actor_for_this_node(hardware: str = "h100-80gb"):
    """The node's actor, created on first use and pinned to this node."""
    node_id = ray.get_runtime_context().get_node_id()
    # mypy keeps a class decorator's input type (python/mypy#3135): this is Ray's ActorClass.
    return GpuControlActor.options(  # type: ignore[attr-defined]
        name=f"gpu-control-{node_id}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(hardware)
