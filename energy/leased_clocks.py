"""A node's GPU clocks under a lease per GPU, so that GPUs are left as they were found.

A replica that locks its GPUs' clocks (through the node's GPU-control actor,
deployments.gpu_actor) leases them: each forward of its clock renews the lease (every
0.25 s), and a replica that stops releases them, which resets them to the driver's default
at once. A lease that lapses (`lease_s` without a renewal: the replica died without cleanup,
SIGKILL, the OOM killer) resets its GPU too. An actor that starts, the first time or
restarted after a failure, takes every GPU of the node on one lease of its own: live
replicas renew theirs within it (the lease then moves to them), and the GPUs nobody claims
(clocks a dead actor or replica left locked) are reset when it lapses.

Time is passed in. Locks and resets go through the clock governor (energy.clock_governor),
which never raises and records each one. Safe to call from several threads (the actor serves
replicas at once): each GPU's NVML calls are serialized by a lock of its own, and a call on
several GPUs runs them through `each_gpu` (the actor's thread pool: NVML's 50-200 ms per lock
would otherwise add up over a TP8 replica's GPUs).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from energy.clock_governor import ClockGovernor
from energy.gpu_control import GpuControlError

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Holds every GPU from the actor's start until replicas claim theirs (whoever held them before).
BEFORE_START = "held before this actor started"
# Why a GPU was reset (the governor's record of it).
RELEASED = "released"
LAPSED = "lease lapsed"


@dataclass(frozen=True)
class Lease:
    holder: str
    expires_s: float


EachGpu = Callable[[Callable[[int], T], Iterable[int]], Iterable[T]]


class LeasedClocks:
    def __init__(self, governor: ClockGovernor, lease_s: float, now_s: float, each_gpu: EachGpu = map) -> None:
        self.governor = governor
        self.lease_s = lease_s
        self._each_gpu = each_gpu
        self._lock = threading.Lock()  # the leases
        self._gpu_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)  # each GPU's NVML calls
        try:
            count = governor.gpus.device_count()
        except GpuControlError as exc:
            logger.error("GPU count failed (%s): no GPU is reset at start", exc)
            count = 0
        self._leases = {index: Lease(BEFORE_START, now_s + lease_s) for index in range(count)}

    def set_clock(self, holder: str, indices: Iterable[int], clock_mhz: float, now_s: float) -> list[int | None]:
        """Renew `holder`'s lease on `indices` (taking over a lease another held: Ray gave the
        GPU to this replica, so its last holder is gone) and lock them near `clock_mhz`: the
        governor's answer per GPU, the clock applied or None where it refused or NVML failed."""
        indices = list(indices)
        with self._lock:
            for index in indices:
                self._leases[index] = Lease(holder, now_s + self.lease_s)

        def lock(index: int) -> int | None:
            with self._gpu_locks[index]:
                return self.governor.set_clock(index, clock_mhz, now_s)

        return list(self._each_gpu(lock, indices))

    def release(self, holder: str, now_s: float) -> list[int]:
        """`holder` stopped: its GPUs back to default clocks now. Returns their indices."""
        return self._reset(lambda lease: lease.holder == holder, now_s, RELEASED)

    def expire(self, now_s: float) -> list[int]:
        """Reset the GPUs whose lease lapsed by `now_s`; their indices."""
        return self._reset(lambda lease: lease.expires_s <= now_s, now_s, LAPSED)

    def holders(self) -> dict[int, str]:
        """Who holds each leased GPU."""
        with self._lock:
            return {index: lease.holder for index, lease in self._leases.items()}

    def _reset(self, ends: Callable[[Lease], bool], now_s: float, why: str) -> list[int]:
        with self._lock:
            ended = {index: lease.holder for index, lease in self._leases.items() if ends(lease)}
            for index in ended:
                del self._leases[index]

        def reset(index: int) -> int:
            with self._gpu_locks[index]:
                self.governor.restore(index, now_s, f"{why} by {ended[index]}")
            return index

        return list(self._each_gpu(reset, ended))
