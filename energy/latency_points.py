"""A real engine's measured latency (vLLM): ITL and TTFT vs batch size and context, with the
energy and clock NVML saw (0 on a CPU backend: reported, not invented). What
`wattwise profile --vllm-model` writes and the engine fit (energy.engine_fit) reads."""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LatencyPoint:
    batch: int
    context_tokens: int
    output_tokens: int  # asked of each request (greedy; a request may stop early at EOS)
    tensor_parallel: int
    ttft_s: float  # mean over the batch (all requests arrive together)
    itl_s: float  # mean time per output token after the first
    tokens_per_s: float  # output tokens of the batch / its wall time
    energy_j: float
    clock_mhz: float


def save_latency_csv(points: list[LatencyPoint], out: str | Path) -> None:
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(LatencyPoint)])
        writer.writeheader()
        writer.writerows(asdict(p) for p in points)


def load_latency_csv(path: str | Path) -> list[LatencyPoint]:
    """Read what save_latency_csv wrote; a missing column names the file and the column."""
    kinds: dict[str, Callable[[str], Any]] = {f.name: (int if f.type == "int" else float) for f in fields(LatencyPoint)}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = set(kinds) - set(rows[0] if rows else kinds)
    if missing:
        raise ValueError(f"{path}: not a `wattwise profile --vllm-model` CSV, missing columns {sorted(missing)}")
    return [LatencyPoint(**{k: kinds[k](r[k]) for k in kinds}) for r in rows]
