"""One privileged GPU-control actor per node: the only path from serving code to clocks.

Replicas lock clocks for their GPUs through it, each GPU under a lease that the replica's
every forward renews (energy.leased_clocks). It clamps, rate-limits and records each change
(energy.clock_governor), and leaves GPUs as it found them: a replica that stops releases its
GPUs (reset at once), one that dies without cleanup lets its lease lapse (reset within
`lease_s` and a check), and the actor itself, restarted after a failure, resets the GPUs no
live replica claims within one lease of its start. It restores default clocks when it stops,
and falls back to the modelled GPU where NVML is missing (its `backend` says which).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from core.overheads import OverheadTable
from energy.clock_governor import ClockGovernor
from energy.gpu_control import GpuControl, GpuControlError, open_gpus
from energy.hardware import GPUS
from energy.leased_clocks import LeasedClocks

NAMESPACE = "wattwise"
# Replicas resend their target every forward period, so a GPU held at default clocks adds a
# refusal record each time: keep the newest records only.
MAX_HISTORY = 10_000
# A replica renews every forward period (0.25 s): ten seconds is forty missed renewals.
LEASE_S = 10.0
LEASE_CHECK_S = 1.0


# The governor's rate limit per GPU, a little under the replicas' forward period: sends jitter by
# milliseconds, and a change refused for that waits a whole period more (bench clock-rate: at the
# full period, 46-64 of ~270 changes per 10 s on 8 TP1 replicas were refused).
MIN_CHANGE_INTERVAL_S = 0.8 * OverheadTable().clock_forward_period_s
# Replicas' calls are served at once (a node's GPUs belong to several replicas), and one
# replica's GPUs are locked at once (NVML takes 50-200 ms a lock): a thread per GPU of a node.
CONCURRENT_CALLS = 16


# Ray's overloads of ray.remote omit max_concurrency, which it takes for actor classes.
@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=CONCURRENT_CALLS)  # type: ignore[call-overload]
class GpuControlActor:
    def __init__(self, hardware: str = "h100-80gb",
                 min_interval_s: float = MIN_CHANGE_INTERVAL_S, lease_s: float = LEASE_S,
                 gpus: GpuControl | None = None) -> None:
        """`gpus`: what the actor controls (None: NVML, or the modelled GPU where it is missing;
        tests and benches hand it a stand-in)."""
        self.governor = ClockGovernor(gpus or open_gpus(GPUS[hardware]), min_interval_s)
        self._nvml_calls = ThreadPoolExecutor(CONCURRENT_CALLS, thread_name_prefix="gpu")
        self.clocks = LeasedClocks(self.governor, lease_s, time.monotonic(), each_gpu=self._nvml_calls.map)
        threading.Thread(target=self._reset_lapsed, name="gpu-lease-check", daemon=True).start()

    def _reset_lapsed(self) -> None:
        while True:
            time.sleep(LEASE_CHECK_S)
            self.clocks.expire(time.monotonic())

    def backend(self) -> str:
        return self.governor.gpus.backend

    def set_clock(self, holder: str, indices: list[int], clock_mhz: float) -> list[int | None]:
        """Renew `holder`'s lease on its GPUs and lock them: the clock each was locked at, or
        None where the governor refused (rate limit, hold after an error) or NVML failed
        (the caller sends its target again at its next forward)."""
        applied = self.clocks.set_clock(holder, indices, clock_mhz, time.monotonic())
        del self.governor.history[:-MAX_HISTORY]
        return applied

    def release(self, holder: str) -> list[int]:
        """`holder` stops: its GPUs back at default clocks now (their indices)."""
        return self.clocks.release(holder, time.monotonic())

    def holders(self) -> dict[int, str]:
        return self.clocks.holders()

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
