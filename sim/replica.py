"""A simulated replica: the shared ContinuousBatcher plus the lifecycle of its GPUs.

starting -> ready -> draining -> stopped. The GPUs draw idle power from the moment
the replica is requested until it stops (start-up and drain included); once ready,
the batcher charges its steps and the idle gaps between them.
"""

from __future__ import annotations

from enum import StrEnum

from autoscaling.chiron.local import LocalBatchAutoscaler
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher, Step
from energy.perf_model import PerfModel


class State(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class SimReplica:
    def __init__(self, replica_id: int, pool: str, tp: int, start_s: float, ready_s: float,
                 perf: PerfModel, planned_perf: PerfModel | None = None) -> None:
        self.replica_id = replica_id
        self.pool = pool
        self.tp = tp
        self.start_s = start_s
        self.ready_s = ready_s
        self.stop_s: float | None = None
        self.state = State.STARTING
        self.idle_w = perf.idle_power_w(tp)
        self.perf = perf
        self.planned_perf = planned_perf  # what the planners believe, if not `perf`
        self.batcher: ContinuousBatcher | None = None
        self.step: Step | None = None
        self.local_autoscaler: LocalBatchAutoscaler | None = None

    def become_ready(self, config: BatcherConfig) -> ContinuousBatcher:
        self.batcher = ContinuousBatcher(self.perf, config, planned_perf=self.planned_perf)
        self.batcher.stats(self.ready_s)  # starts the batcher's idle accounting here
        self.state = State.READY
        return self.batcher

    @property
    def ready_batcher(self) -> ContinuousBatcher:
        """The batcher of a replica that became ready (a starting replica has none)."""
        if self.batcher is None:
            raise RuntimeError(f"replica {self.replica_id} of {self.pool} is not ready yet")
        return self.batcher

    @property
    def load(self) -> int:
        b = self.batcher
        return len(b.waiting) + len(b.running) if b is not None else 0

    @property
    def idle(self) -> bool:
        return self.step is None and (self.batcher is None or not self.batcher.has_work())

    def stop(self, now_s: float) -> None:
        self.state = State.STOPPED
        self.stop_s = now_s

    def held_s(self, now_s: float) -> float:
        """GPU-holding time of the replica up to `now_s` (per replica, not per GPU)."""
        end = now_s if self.stop_s is None else min(self.stop_s, now_s)
        return max(end - self.start_s, 0.0)

    def energy_j(self, now_s: float) -> float:
        """Energy of the replica's GPUs up to `now_s` (a step in flight counts when it ends)."""
        end = now_s if self.stop_s is None else min(self.stop_s, now_s)
        before_ready = max(min(self.ready_s, end) - self.start_s, 0.0) * self.idle_w
        b = self.batcher
        if b is None:
            return before_ready
        gap = max(end - (b.accounted_until_s or end), 0.0) if self.step is None else 0.0
        return before_ready + b.energy_j + gap * self.idle_w
