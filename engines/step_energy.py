"""A vLLM replica's energy, step by step: read from its GPUs and given by the model, side by side.

NVML counts joules per GPU since the driver loaded (nvmlDeviceGetTotalEnergyConsumption), not
per request. After each engine step vLLM reports, the meter reads the counter (summed over the
replica's GPUs) and splits what the GPUs used since the last reading among the requests that
step ran, by their share of its work (each one's tokens in it: engines.vllm_running_batch). What
the GPUs use while no request is inside (from a batch's last step until the next request comes)
is the replica's idle energy: reported on its own, charged to no request. So requests' energy
plus idle energy is the counter's whole rise.

The perf/power model the planner believes is booked the same way beside it: its joules for
each step's work (engines.vllm_step_speed), its idle power over the idle time. An operator sees
the model's error on their own fleet (`wattwise_energy_joules{source="nvml"|"model"}`).

The driver refreshes the counter on its own period, not at each step (not measured here): a
single step's reading may hold a neighbour's joules, so one step's split is lumpy; a request's
sum over its steps is sound. Without NVML (CPU backends, no driver) nothing is measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from energy.gpu_control import GpuControl, GpuControlError, NvmlGpu

logger = logging.getLogger(__name__)


@dataclass
class EnergyLedger:
    """One source's joules since the replica started: in total, while idle, and per request
    still to be told its share."""

    total_j: float = 0.0
    idle_j: float = 0.0
    requests_j: dict[str, float] = field(default_factory=dict)

    def book_step(self, joules: float, work: dict[str, int]) -> None:
        """A step's joules, shared by `work` (request id -> its tokens in the step, not empty)."""
        self.total_j += joules
        tokens = sum(work.values())
        for request_id, n in work.items():
            self.requests_j[request_id] = self.requests_j.get(request_id, 0.0) + joules * n / tokens

    def book_idle(self, joules: float) -> None:
        self.total_j += joules
        self.idle_j += joules

    def take(self, request_id: str) -> float:
        """The request's joules so far, forgotten here (it finished or left)."""
        return self.requests_j.pop(request_id, 0.0)


class StepEnergy:
    def __init__(self, gpus: GpuControl | None, gpu_indices: list[int], idle_power_w: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`gpus`: the replica's GPUs to read (None: nothing measured); `idle_power_w`: the
        model's idle power of the replica's GPUs (None: nothing modelled)."""
        self._gpus = gpus
        self.gpu_indices = gpu_indices
        self._idle_power_w = idle_power_w
        self._clock = clock
        self.measured = EnergyLedger() if gpus is not None else None
        self.modelled = EnergyLedger() if idle_power_w is not None else None
        self._read_failed = False
        self._last_j = self._read_j()
        self._last_s = clock()

    @classmethod
    def open(cls, gpu_indices: list[int], idle_power_w: float | None = None) -> StepEnergy:
        """NVML on the replica's GPUs (reads need no privilege), if it answers."""
        if not gpu_indices:
            return cls(None, [], idle_power_w)
        try:
            return cls(NvmlGpu(), gpu_indices, idle_power_w)
        except (GpuControlError, ImportError) as exc:
            logger.warning("NVML unavailable (%s): request energy is the model's, or 0 J without one", exc)
            return cls(None, [], idle_power_w)

    def _read_j(self) -> float | None:
        """The counter summed over the GPUs; None where a read fails (logged once): the next
        reading that succeeds books what was missed."""
        if self._gpus is None:
            return 0.0
        try:
            return sum(self._gpus.energy_j(i) for i in self.gpu_indices)
        except GpuControlError as exc:
            if not self._read_failed:
                logger.error("reading the GPUs' energy counter failed (%s); booked at the next reading", exc)
            self._read_failed = True
            return None

    def _since_last(self) -> tuple[float, float]:
        """Joules the GPUs used and seconds passed since the last reading."""
        now_j, now_s = self._read_j(), self._clock()
        passed_s, self._last_s = now_s - self._last_s, now_s
        if now_j is None:
            return 0.0, passed_s
        used_j = 0.0 if self._last_j is None else now_j - self._last_j  # None: no reading yet to count from
        self._last_j = now_j
        return used_j, passed_s

    def on_step(self, work: dict[str, int], modelled_j: float | None) -> None:
        """A step vLLM reported: `work` as VllmRunningBatch.on_step gives it, `modelled_j` the
        model's joules for it."""
        used_j, passed_s = self._since_last()
        if not work:  # none of ours in it (they had left): idle
            self._book_idle(used_j, passed_s)
            return
        if self.measured is not None:
            self.measured.book_step(used_j, work)
        if self.modelled is not None and modelled_j is not None:
            self.modelled.book_step(modelled_j, work)

    def idle(self) -> None:
        """No request was inside since the last reading (the first request enters an empty
        replica, or its last one left after the last step): idle energy."""
        self._book_idle(*self._since_last())

    def _book_idle(self, used_j: float, passed_s: float) -> None:
        if self.measured is not None:
            self.measured.book_idle(used_j)
        if self.modelled is not None and self._idle_power_w is not None:
            self.modelled.book_idle(self._idle_power_w * passed_s)

    def take_j(self, request_id: str) -> float:
        """The request's energy: measured where the GPUs are read, else the model's."""
        measured = self.measured.take(request_id) if self.measured is not None else 0.0
        modelled = self.modelled.take(request_id) if self.modelled is not None else 0.0
        return measured if self.measured is not None else modelled

    def power_w(self) -> float:
        return 0.0 if self._gpus is None else sum(self._gpus.power_w(i) for i in self.gpu_indices)
