"""What a doubling of tensor parallelism does to a decode step and its power, measured.

The ML.ENERGY Leaderboard ran two dense models at TP1 and TP2 on H100 at the same batch sizes
(energy/data/mlenergy_tp_pairs.csv). A decode step there is overhead + weights / (tp x
bandwidth) + per-sequence work / tp; the overhead grows by a fixed time per doubling (the
all-reduce). Fitting each model's overhead and per-sequence cost with one shared growth gives
GpuSpec.tp_comm_ms_per_doubling. The above-floor power per GPU at TP2 over TP1, same batch,
gives GpuSpec.tp_power_ratio_per_doubling. PerfModel uses both for the TPs a profile did not
measure; DynamoLLM's TP8/TP4 energies (energy.model_check) are the check, not the fit.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from energy.hardware import GpuSpec

TP_PAIRS_CSV = Path(__file__).parent / "data" / "mlenergy_tp_pairs.csv"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class TpRow:
    model_id: str
    tp: int
    max_num_seqs: int
    batch: float
    itl_ms: float
    power_w: float  # all GPUs
    weight_bytes: float


def load_tp_rows(path: Path = TP_PAIRS_CSV) -> list[TpRow]:
    with open(path, newline="") as fh:
        return [TpRow(r["model_id"], int(r["num_gpus"]), int(r["max_num_seqs"]), float(r["avg_batch_size"]),
                      float(r["median_itl_ms"]), float(r["avg_power_watts"]),
                      float(r["total_params_b"]) * 1e9 * _DTYPE_BYTES[r["weight_precision"]])
                for r in csv.DictReader(fh)]


@dataclass(frozen=True)
class TpScaling:
    comm_ms_per_doubling: float
    power_ratio_per_doubling: float
    itl_mape_pct: float  # of the step model on the rows it was fitted on


def fit_tp_scaling(gpu: GpuSpec, rows: list[TpRow] | None = None) -> TpScaling:
    """Least squares on ITL: per model an overhead and a per-sequence cost, one shared growth
    of the overhead per doubling; the power ratio is the geometric mean over the pairs."""
    rows = load_tp_rows() if rows is None else rows
    if gpu.hbm_tb_per_s is None:
        raise ValueError(f"{gpu.name}: no HBM bandwidth to split the step with")
    models = sorted({r.model_id for r in rows})
    a = np.zeros((len(rows), 2 * len(models) + 1))
    y = np.zeros(len(rows))
    for i, r in enumerate(rows):
        m = models.index(r.model_id)
        a[i, 2 * m] = 1.0  # overhead
        a[i, 2 * m + 1] = r.batch / r.tp  # per-sequence work, split tp ways
        a[i, -1] = math.log2(r.tp)  # the all-reduce's growth
        y[i] = r.itl_ms - r.weight_bytes / r.tp / (gpu.hbm_tb_per_s * 1e12 * gpu.hbm_efficiency) * 1000
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    predicted = a @ coef + (np.array([r.itl_ms for r in rows]) - y)
    mape = float(np.mean(np.abs(predicted / np.array([r.itl_ms for r in rows]) - 1)) * 100)
    by_pair: dict[tuple[str, int], dict[int, TpRow]] = {}
    for r in rows:
        by_pair.setdefault((r.model_id, r.max_num_seqs), {})[r.tp] = r
    logs = []
    for pair in by_pair.values():
        tps = sorted(pair)
        for lo, hi in pairwise(tps):
            doublings = math.log2(hi / lo)
            above_hi = pair[hi].power_w / hi - gpu.idle_w
            above_lo = pair[lo].power_w / lo - gpu.idle_w
            logs.append(math.log(above_hi / above_lo) / doublings)
    return TpScaling(float(coef[-1]), float(math.exp(np.mean(logs))), mape)
