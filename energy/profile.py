"""Energy-performance profiles (DynamoLLM §IV-A): power, TTFT and TBT of one instance as
functions of request class, TP, GPU clock and load, interpolated between measured loads.

A profile is data: points (class, TP, clock, load) -> (power, TTFT, TBT), built from the
performance/power model by default (`build_profile`) or from measured sweeps of a
running engine (`wattwise profile`), saved as JSON and shared by every service of a
model. Between measured loads, monotone cubic interpolation (scipy's PCHIP); extra
points are measured where power jumps between neighbours, as the paper does.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.interpolate import PchipInterpolator

from core.slo import SLO
from energy.hardware import GpuSpec

# DynamoLLM profiles 800-1980 MHz in 200 MHz steps (an H100's range).
PROFILE_CLOCKS_MHZ = (800, 1000, 1200, 1400, 1600, 1800, 1980)
PROFILE_TPS = (2, 4, 8)
# Mean prompt and output tokens per length class in the Azure conversation trace
# (data/azure, 2023): the request shape each class is profiled with.
CONV_CLASS_SHAPES: dict[str, tuple[int, int]] = {
    "SS": (181, 55), "SM": (168, 170), "SL": (181, 766),
    "MS": (446, 78), "MM": (455, 122), "ML": (985, 421),
    "LS": (2979, 61), "LM": (2160, 152), "LL": (1111, 428),
}



def profile_clocks_mhz(gpu: GpuSpec) -> tuple[int, ...]:
    """DynamoLLM's profiled clocks that `gpu` runs, and its top clock. An A100 tops out at
    1,410 MHz: a point at 1,980 would be its 1,410 again under another name, and a plan
    naming it a clock the GPU cannot set."""
    inside = tuple(c for c in PROFILE_CLOCKS_MHZ if gpu.min_clock_mhz <= c < gpu.max_clock_mhz)
    return (*inside, gpu.max_clock_mhz)


@dataclass(frozen=True)
class ProfilePoint:
    length_class: str
    tp: int
    clock_mhz: int
    rate_per_s: float  # requests/s offered to one instance
    power_w: float  # mean power of the instance's GPUs
    ttft_s: float
    tbt_s: float


@dataclass(frozen=True)
class _Curve:
    """One (class, TP, clock)'s points by load and their PCHIP pieces, read in scalars: a
    planner epoch reads hundreds of loads, and a call into scipy costs ~20x the arithmetic.
    A piece is evaluated as scipy's PPoly evaluates it (the power series in the offset from
    its break, summed from the constant up), so the values are scipy's to the bit."""

    points: tuple[ProfilePoint, ...]
    breaks: list[float]
    # Per interval, per value (power, TTFT, TBT): the coefficients of offset^0 .. offset^3.
    pieces: list[list[tuple[float, float, float, float]]]

    @classmethod
    def fit(cls, points: list[ProfilePoint]) -> _Curve:
        ordered = tuple(sorted(points, key=lambda p: p.rate_per_s))
        if len(ordered) < 2:  # nothing lies between loads: at() reads the one point
            return cls(ordered, [], [])
        rates = np.array([p.rate_per_s for p in ordered])
        values = np.array([[p.power_w, p.ttft_s, p.tbt_s] for p in ordered])
        c = PchipInterpolator(rates, values, axis=0, extrapolate=False).c  # (degree 3..0, interval, value)
        pieces = [[(float(c[3, i, v]), float(c[2, i, v]), float(c[1, i, v]), float(c[0, i, v])) for v in range(3)]
                  for i in range(c.shape[1])]
        return cls(ordered, rates.tolist(), pieces)

    @property
    def top_rate_per_s(self) -> float:
        return self.points[-1].rate_per_s

    def at(self, rate_per_s: float) -> tuple[float, float, float] | None:
        if rate_per_s > self.top_rate_per_s:
            return None
        first = self.points[0]
        if rate_per_s <= first.rate_per_s:
            return first.power_w, first.ttft_s, first.tbt_s
        i = min(bisect.bisect_right(self.breaks, rate_per_s) - 1, len(self.breaks) - 2)
        s = rate_per_s - self.breaks[i]
        s2 = s * s
        s3 = s2 * s
        power, ttft, tbt = (c0 + c1 * s + c2 * s2 + c3 * s3 for c0, c1, c2, c3 in self.pieces[i])
        return power, ttft, tbt


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
        self._curves = {k: _Curve.fit(v) for k, v in grouped.items()}
        # Read in the planner's loops, so worked out once.
        self._tps = sorted({k[1] for k in self._curves})
        self._clocks_mhz = sorted({k[2] for k in self._curves})
        self._classes = sorted({k[0] for k in self._curves})
        self._lightest_w: dict[tuple[int, int], float] = {}
        for (_, tp, clock), curve in self._curves.items():
            power = curve.points[0].power_w
            self._lightest_w[(tp, clock)] = min(power, self._lightest_w.get((tp, clock), power))

    @property
    def tensor_parallel_degrees(self) -> list[int]:
        return list(self._tps)

    @property
    def clocks_mhz(self) -> list[int]:
        return list(self._clocks_mhz)

    @property
    def classes(self) -> list[str]:
        return list(self._classes)

    def max_rate_per_s(self, length_class: str, tp: int, clock_mhz: int) -> float:
        """The highest profiled load (the instance's SLO-feasible capacity); 0 if none is."""
        curve = self._curves.get((length_class, tp, clock_mhz))
        return 0.0 if curve is None else curve.top_rate_per_s

    def at(self, length_class: str, tp: int, clock_mhz: int, rate_per_s: float) -> tuple[float, float, float] | None:
        """(power W, TTFT s, TBT s) at a load; None beyond the profiled capacity."""
        curve = self._curves.get((length_class, tp, clock_mhz))
        return None if curve is None else curve.at(rate_per_s)

    def lightest_power_w(self, tp: int, clock_mhz: int) -> float:
        """The least power of any class at its lightest profiled load at (TP, clock): close to
        the instance's idle draw; 0 where nothing is profiled there."""
        return self._lightest_w.get((tp, clock_mhz), 0.0)

    def meets(self, length_class: str, tp: int, clock_mhz: int, rate_per_s: float, slo: SLO,
              headroom: float = 1.0) -> bool:
        value = self.at(length_class, tp, clock_mhz, rate_per_s)
        return value is not None and value[1] <= slo.ttft_s * headroom and value[2] <= slo.tbt_s * headroom

    def capacity(self, length_class: str, tp: int, clock_mhz: int, slo: SLO, headroom: float = 1.0) -> float:
        """Highest profiled load that meets `slo` scaled by `headroom` (0 if none does)."""
        return self.capacity_within(length_class, tp, clock_mhz, slo.ttft_s * headroom, slo.tbt_s * headroom)

    def capacity_within(self, length_class: str, tp: int, clock_mhz: int, ttft_s: float, tbt_s: float) -> float:
        """Highest profiled load whose TTFT and TBT are within these (0 if none is)."""
        curve = self._curves.get((length_class, tp, clock_mhz))
        for p in reversed(curve.points if curve is not None else ()):
            if p.ttft_s <= ttft_s and p.tbt_s <= tbt_s:
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
