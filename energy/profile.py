"""Energy-performance profiles (DynamoLLM §IV-A): power, TTFT and TBT of one instance as
functions of request class, TP, GPU clock and load, interpolated between measured loads.

A profile is data: points (class, TP, clock, load) -> (power, TTFT, TBT), built from the
performance/power model by default (`build_profile`) or from measured sweeps of a
running engine (`wattwise profile`), saved as JSON and shared by every service of a
model. Between measured loads, monotone cubic interpolation (scipy's PCHIP); extra
points are measured where power jumps between neighbours, as the paper does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from scipy.interpolate import PchipInterpolator

from core.slo import SLO

# DynamoLLM profiles 800-1980 MHz in 200 MHz steps.
PROFILE_CLOCKS_MHZ = (800, 1000, 1200, 1400, 1600, 1800, 1980)
PROFILE_TPS = (2, 4, 8)
# Mean prompt and output tokens per length class in the Azure conversation trace
# (data/azure, 2023): the request shape each class is profiled with.
CONV_CLASS_SHAPES: dict[str, tuple[int, int]] = {
    "SS": (181, 55), "SM": (168, 170), "SL": (181, 766),
    "MS": (446, 78), "MM": (455, 122), "ML": (985, 421),
    "LS": (2979, 61), "LM": (2160, 152), "LL": (1111, 428),
}


@dataclass(frozen=True)
class ProfilePoint:
    length_class: str
    tp: int
    clock_mhz: int
    rate_per_s: float  # requests/s offered to one instance
    power_w: float  # mean power of the instance's GPUs
    ttft_s: float
    tbt_s: float


class EnergyProfile:
    """Lookup and interpolation over profile points of one (model, GPU)."""

    def __init__(self, model: str, hardware: str, points: list[ProfilePoint],
                 weight_bytes: float | None = None) -> None:
        self.model = model
        self.hardware = hardware
        self.points = points
        # The profiled model's weights (re-sharding moves them); None: a built-in model's.
        self.weight_bytes = weight_bytes
        grouped: dict[tuple[str, int, int], list[ProfilePoint]] = defaultdict(list)
        for p in points:
            grouped[(p.length_class, p.tp, p.clock_mhz)].append(p)
        self._curves = {k: sorted(v, key=lambda p: p.rate_per_s) for k, v in grouped.items()}

    @property
    def tensor_parallel_degrees(self) -> list[int]:
        return sorted({k[1] for k in self._curves})

    @property
    def clocks_mhz(self) -> list[int]:
        return sorted({k[2] for k in self._curves})

    @property
    def classes(self) -> list[str]:
        return sorted({k[0] for k in self._curves})


    @cached_property
    def _interpolators(self) -> dict[tuple[str, int, int], tuple[float, PchipInterpolator]]:
        out = {}
        for key, pts in self._curves.items():
            rates = np.array([p.rate_per_s for p in pts])
            values = np.array([[p.power_w, p.ttft_s, p.tbt_s] for p in pts])
            out[key] = (float(rates[-1]), PchipInterpolator(rates, values, axis=0, extrapolate=False))
        return out

    def max_rate_per_s(self, length_class: str, tp: int, clock_mhz: int) -> float:
        """The highest profiled load (the instance's SLO-feasible capacity); 0 if none is."""
        entry = self._interpolators.get((length_class, tp, clock_mhz))
        return 0.0 if entry is None else entry[0]

    def at(self, length_class: str, tp: int, clock_mhz: int, rate_per_s: float) -> tuple[float, float, float] | None:
        """(power W, TTFT s, TBT s) at a load; None beyond the profiled capacity."""
        entry = self._interpolators.get((length_class, tp, clock_mhz))
        if entry is None or rate_per_s > entry[0]:
            return None
        _, interp = entry
        first = self._curves[(length_class, tp, clock_mhz)][0]
        if rate_per_s <= first.rate_per_s:
            return first.power_w, first.ttft_s, first.tbt_s
        power, ttft, tbt = interp(rate_per_s)
        return float(power), float(ttft), float(tbt)

    def meets(self, length_class: str, tp: int, clock_mhz: int, rate_per_s: float, slo: SLO,
              headroom: float = 1.0) -> bool:
        value = self.at(length_class, tp, clock_mhz, rate_per_s)
        return value is not None and value[1] <= slo.ttft_s * headroom and value[2] <= slo.tbt_s * headroom

    def capacity(self, length_class: str, tp: int, clock_mhz: int, slo: SLO, headroom: float = 1.0) -> float:
        """Highest profiled load that meets `slo` scaled by `headroom` (0 if none does)."""
        for p in reversed(self._curves.get((length_class, tp, clock_mhz), [])):
            if p.ttft_s <= slo.ttft_s * headroom and p.tbt_s <= slo.tbt_s * headroom:
                return p.rate_per_s
        return 0.0

    def save(self, path: str | Path) -> None:
        payload = {"model": self.model, "hardware": self.hardware, "weight_bytes": self.weight_bytes,
                   "points": [asdict(p) for p in self.points]}
        Path(path).write_text(json.dumps(payload))

    @classmethod
    def load(cls, path: str | Path) -> EnergyProfile:
        data = json.loads(Path(path).read_text())
        return cls(data["model"], data["hardware"], [ProfilePoint(**p) for p in data["points"]],
                   data.get("weight_bytes"))
