"""What holding GPUs costs: two references beside the oracle floor (sim/oracle.py).

The floor turns GPUs on and off for free each minute. A policy's distance from it mixes what a
replica costs to start (OverheadTable.startup_s at idle power, as the simulator charges it),
bursts shorter than the floor's minute, and not knowing when the next burst lands. Two
references on short windows separate the last from the first two:

- `WindowPower.clairvoyant_floor`: knows every arrival and may change its GPUs every window,
  but a GPU it turns on first idles for `startup_s`, and a GPU on and unused idles. The GPUs on
  per window are chosen by dynamic programming, exactly for the fluid model; TP and clock
  changes are free, so it stays a floor.
- `WindowPower.peak_held`: one GPU count through the whole run (the least energy of every count
  that carries each window): what holding the largest burst's GPUs costs a policy that cannot
  tell when that burst lands. Not a floor.

Windows are 5 s by default: longer than every TTFT target, so carrying each window's load over
the window asks less than the SLO does (the TBT target is the floor's, `tbt_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config import SimConfig
from sim.oracle import CarrierSearch, OracleResult, binned_loads, oracle_energy
from sim.workload import Workload


@dataclass(frozen=True)
class HeldCapacity:
    """One reference's energy, GPU-hours and GPUs held at most."""

    energy_j: float
    gpu_hours: float
    peak_gpus: int


@dataclass(frozen=True)
class WindowPower:
    """The least power (W) of every window (rows) with N GPUs on (columns, 0..cluster_gpus): the
    cheapest configuration carrying the window's load within N GPUs, the rest idle; inf where N
    cannot carry it. Windows nothing within the cluster carries cost only idle power, as they
    cost nothing in the oracle floor, and are counted."""

    power_w: np.ndarray
    window_s: float
    start_j: float  # one GPU turned on: startup_s at idle power
    uncarried_windows: int

    @classmethod
    def of(cls, w: Workload, config: SimConfig, window_s: float = 5.0, batch_pace_s: float = 60.0,
           tbt_s: float = 0.1) -> WindowPower:
        search = CarrierSearch(config, tbt_s)
        idle_w = search.cap.perf.gpu.idle_w
        on = np.arange(config.cluster_gpus + 1)
        loads = binned_loads(w, window_s, batch_pace_s)
        power = np.tile(on * idle_w, (len(loads), 1)).astype(float)
        uncarried = 0
        for k, load in enumerate(loads):
            if load is None:
                continue
            carriers = search.carriers(load)
            if not carriers:
                uncarried += 1
                continue
            row = np.full(len(on), np.inf)
            for c in carriers:
                row = np.minimum(row, np.where(on >= c.gpus, c.power_w + (on - c.gpus) * idle_w, np.inf))
            power[k] = row
        return cls(power, window_s, config.overheads.startup_s * idle_w, uncarried)

    def clairvoyant_floor(self) -> HeldCapacity:
        """The least energy of any schedule of GPUs on that carries every window, each GPU turned
        on paying `start_j` first; the run may start with any GPUs on."""
        power, window_s = self.power_w, self.window_s
        on = np.arange(power.shape[1])
        cost = power[0] * window_s
        came_from = np.zeros(power.shape, dtype=np.int64)
        for k in range(1, len(power)):
            # From N GPUs to N': turn any off for nothing, or turn the missing ones on.
            kept_from = _suffix_argmin(cost)
            grown_from = _prefix_argmin(cost - self.start_j * on)
            kept = cost[kept_from]
            grown = cost[grown_from] + self.start_j * (on - grown_from)
            came_from[k] = np.where(kept <= grown, kept_from, grown_from)
            cost = np.minimum(kept, grown) + power[k] * window_s
        held = [int(np.argmin(cost))]
        for k in range(len(power) - 1, 0, -1):
            held.append(int(came_from[k][held[-1]]))
        return HeldCapacity(float(cost.min()), sum(held) * window_s / 3600.0, max(held))

    def peak_held(self) -> HeldCapacity:
        """The least energy of one GPU count held through the run (on before it, for free),
        each window at its cheapest configuration inside it."""
        total_j = self.power_w.sum(axis=0) * self.window_s
        n = int(np.argmin(total_j))
        return HeldCapacity(float(total_j[n]), n * len(self.power_w) * self.window_s / 3600.0, n)


@dataclass(frozen=True)
class FloorRow:
    """One of `Floors` as the tables and JSON reports print it."""

    name: str  # the JSON's policy name
    label: str  # the tables' row label
    energy_j: float
    gpu_hours: float
    peak_gpus: int | None  # GPUs held at most (None: the oracle, whose GPUs change each window)


@dataclass(frozen=True)
class Floors:
    """The oracle floor targets are read against, and the two references that split a
    policy's distance from it, on the same workload (batch work at the floor's pace)."""

    oracle: OracleResult
    clairvoyant: HeldCapacity
    peak_held: HeldCapacity

    @classmethod
    def of(cls, w: Workload, config: SimConfig) -> Floors:
        oracle = oracle_energy(w, config)
        held = WindowPower.of(w, config, batch_pace_s=oracle.batch_pace_s)
        return cls(oracle, held.clairvoyant_floor(), held.peak_held())

    def rows(self) -> list[FloorRow]:
        """The floor, then the clairvoyant schedule paying start-ups, then the peak burst held."""
        return [FloorRow("oracle", "oracle (floor)", self.oracle.energy_j, self.oracle.gpu_hours, None),
                *(FloorRow(name, label, ref.energy_j, ref.gpu_hours, ref.peak_gpus) for name, label, ref in (
                    ("clairvoyant-floor", "clairvoyant 5 s", self.clairvoyant),
                    ("peak-held", "peak held", self.peak_held)))]


def _prefix_argmin(x: np.ndarray) -> np.ndarray:
    """[i]: the index of the least of x[:i+1] (the first, on ties): the latest index at
    which the running least fell."""
    fell = np.empty(len(x), dtype=bool)
    fell[0] = True
    fell[1:] = x[1:] < np.minimum.accumulate(x)[:-1]
    return np.maximum.accumulate(np.where(fell, np.arange(len(x)), 0))


def _suffix_argmin(x: np.ndarray) -> np.ndarray:
    """[i]: the index of the least of x[i:]."""
    return len(x) - 1 - _prefix_argmin(x[::-1])[::-1]
