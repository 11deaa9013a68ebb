"""The grid each region draws from, over time: carbon intensity (gCO2/kWh) and price.

Deferrable work (the Batch API) runs in the cleaner or cheaper hours and regions, and a
federation front may lean its interactive work toward the cleaner region. Both read a
`GridSignal`: a provider that answers for any region and time. The one shipped reads a
CSV of one value per slot (an hour by default) of a repeating day per region; a provider
of live data (an operator's, or a carbon-intensity service's) implements the same
protocol. Tests and the simulator use the CSV: no network.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from core.paths import shipped

EXAMPLE_CSV = "data/grid/synthetic_two_regions.csv"
Objective = Literal["carbon", "price"]


@dataclass(frozen=True)
class GridPoint:
    carbon_g_per_kwh: float
    price_usd_per_mwh: float

    def cost(self, objective: Objective) -> float:
        return self.carbon_g_per_kwh if objective == "carbon" else self.price_usd_per_mwh


class GridSignal(Protocol):
    @property
    def regions(self) -> Sequence[str]: ...

    def at(self, region: str, t_s: float) -> GridPoint:
        """The grid of `region` at `t_s` (Unix seconds, or a simulation's own clock)."""
        ...

    def slot_of(self, t_s: float) -> int:
        """The slot `t_s` falls in: its values hold for the whole slot."""
        ...

    def slot_start_s(self, slot: int) -> float: ...


class GridSignalConfig(BaseModel):
    """Where the grid's carbon intensity and price come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    csv: str = Field(default=EXAMPLE_CSV, description="CSV of `region,slot,carbon_g_per_kwh,price_usd_per_mwh`, one row per region and slot of a repeating day ('#' lines are comments). The default ships two synthetic regions, labelled as such (data/grid/README.md).")
    slot_s: float = Field(default=3600.0, gt=0, description="How long each row's values hold (s): an hour.")
    anchor_s: float = Field(default=0.0, description="When slot 0 starts (Unix s): 0 puts it at midnight UTC. A simulation counts from its own t = 0.")


class HourlyGridSignal:
    """One value per slot of a repeating day, per region."""

    def __init__(self, slots: dict[str, list[GridPoint]], slot_s: float = 3600.0, anchor_s: float = 0.0) -> None:
        lengths = {len(v) for v in slots.values()}
        if not slots or len(lengths) != 1 or 0 in lengths:
            raise ValueError(f"every region needs the same, non-zero number of slots; got {lengths or 'none'}")
        self._slots, self.slot_s, self.anchor_s = slots, slot_s, anchor_s
        self.slots_per_period = lengths.pop()

    @classmethod
    def from_config(cls, config: GridSignalConfig) -> HourlyGridSignal:
        return cls(read_grid_csv(config.csv), config.slot_s, config.anchor_s)

    @property
    def regions(self) -> Sequence[str]:
        return tuple(self._slots)

    def at(self, region: str, t_s: float) -> GridPoint:
        try:
            series = self._slots[region]
        except KeyError:
            raise KeyError(f"no grid series for region {region!r}; regions: {sorted(self._slots)}") from None
        return series[self.slot_of(t_s) % self.slots_per_period]

    def slot_of(self, t_s: float) -> int:
        return int((t_s - self.anchor_s) // self.slot_s)

    def slot_start_s(self, slot: int) -> float:
        return self.anchor_s + slot * self.slot_s


def read_grid_csv(path: str) -> dict[str, list[GridPoint]]:
    """{region: its points in slot order}; a path relative to the checkout may name a shipped file.
    Raises ValueError naming the file and line when a row is bad or a slot is missing."""
    file = Path(path).expanduser()
    file = file if file.is_absolute() or file.exists() else shipped(path)
    rows: dict[str, dict[int, GridPoint]] = {}
    with open(file, newline="") as handle:
        lines = (line for line in handle if line.strip() and not line.lstrip().startswith("#"))
        for n, row in enumerate(csv.DictReader(lines), start=2):
            try:
                point = GridPoint(float(row["carbon_g_per_kwh"]), float(row["price_usd_per_mwh"]))
                slot = int(row["slot"])
                region = row["region"].strip()
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{file}: data row {n}: needs region, slot, carbon_g_per_kwh, price_usd_per_mwh "
                                 f"({exc})") from None
            if point.carbon_g_per_kwh < 0 or slot < 0 or not region:
                raise ValueError(f"{file}: data row {n}: a region, a slot >= 0 and a carbon intensity >= 0")
            rows.setdefault(region, {})[slot] = point
    out = {}
    for region, by_slot in rows.items():
        missing = sorted(set(range(max(by_slot) + 1)) - set(by_slot))
        if missing:
            raise ValueError(f"{file}: region {region!r} has no row for slots {missing}")
        out[region] = [by_slot[i] for i in range(len(by_slot))]
    return out
