"""DynamoLLM's measured energy tables (Tables I-III of the seed paper), as data.

Llama2-70B (and five other models in Table III) on a DGX-H100 with vLLM: energy in Wh of one
instance at a fixed load, by TP (2, 4, 8) and GPU clock (0.8, 1.2, 1.6, 2.0 GHz). A blank cell
is a configuration that violated the class's SLO. Table I varies the length class at 2,000
input tokens/s; Table II the load for medium prompts and outputs (MM); Table III the model.
The file is energy/data/dynamollm_tables.csv; in the seed's text Table I's first header cell
(TP2 at 0.8 GHz) was lost, and its rows' cells are read from the right (the text's argmins,
e.g. SS at TP2 1.2 GHz and LL at TP8 1.6 GHz, confirm the reading).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TABLES_CSV = Path(__file__).parent / "data" / "dynamollm_tables.csv"
TENSOR_PARALLEL = (2, 4, 8)
CLOCKS_GHZ = ("0.8", "1.2", "1.6", "2.0")


@dataclass(frozen=True)
class MeasuredRow:
    """One table row: energy by TP (rows of `energy_wh`) and clock (columns); nan = SLO missed."""

    table: str  # "I", "II" or "III"
    name: str  # the row's label: a length class, a load, or a model
    model: str
    length_class: str
    tokens_per_s: float
    energy_wh: np.ndarray
    counts_output: bool = True  # the load counts output tokens too (see rate_per_s)

    @property
    def label(self) -> str:
        return f"Table {self.table} {self.name}"

    def rate_per_s(self, prompt_tokens: float, output_tokens: float) -> float:
        """The load in requests/s for requests of this shape. Table I's caption gives the load
        in tokens per second, prompt and output together; Table II's text says processed input
        tokens, but its medium row is Table I's MM row, so one reading serves both. Read as
        input tokens alone, the model meets the argmin target in 6 of 11 rows instead of 8
        (`wattwise bench model-check` prints both)."""
        return self.tokens_per_s / (prompt_tokens + (output_tokens if self.counts_output else 0.0))


def load_tables(path: Path = TABLES_CSV) -> list[MeasuredRow]:
    cells: dict[tuple[str, str], dict[str, str]] = {}
    grids: dict[tuple[str, str], np.ndarray] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            key = (r["table"], r["row"])
            cells.setdefault(key, r)
            grid = grids.setdefault(key, np.full((len(TENSOR_PARALLEL), len(CLOCKS_GHZ)), np.nan))
            if r["energy_wh"]:
                grid[TENSOR_PARALLEL.index(int(r["tp"])), CLOCKS_GHZ.index(r["clock_ghz"])] = float(r["energy_wh"])
    return [MeasuredRow(t, name, r["model"], r["length_class"], float(r["tokens_per_s"]), grids[(t, name)])
            for (t, name), r in cells.items()]
