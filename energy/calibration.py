"""Fit the performance model on Splitwise's measured latencies and report its error.

Source: energy/data/perf_model.csv (see energy/data/README.md for provenance).
Rows are one-dimensional sweeps (prompt size, batch size, output size) per model,
hardware and TP. Fits minimise relative error with non-negative coefficients.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from energy.hardware import GPUS, MODELS
from energy.perf_model import PerfModel, PhaseFit

DEFAULT_CSV = Path(__file__).parent / "data" / "perf_model.csv"


@dataclass(frozen=True)
class Measurement:
    model: str
    hardware: str
    tp: int
    prompt_size: int
    batch_size: int
    token_size: int
    prompt_ms: float
    token_ms: float

    @property
    def config_key(self) -> tuple[int, int, int]:
        return (self.prompt_size, self.batch_size, self.token_size)

    # Decode runs over outputs of token_size; on average a sequence holds half of it.
    @property
    def mean_context_tokens(self) -> float:
        return self.batch_size * (self.prompt_size + self.token_size / 2)


def load_measurements(path: Path = DEFAULT_CSV) -> list[Measurement]:
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            m = Measurement(
                model=r["model"], hardware=r["hardware"], tp=int(r["tensor_parallel"]),
                prompt_size=int(r["prompt_size"]), batch_size=int(r["batch_size"]),
                token_size=int(r["token_size"]), prompt_ms=float(r["prompt_time"]),
                token_ms=float(r["token_time"]),
            )
            if not is_failed_run(m):
                rows.append(m)
    return rows


def is_failed_run(m: Measurement) -> bool:
    """TP2 at batch 64 reports a prompt time 8x below batch 32 on every GPU: a run that
    did not do the work (likely out of KV memory). Excluded from every fit."""
    return m.tp == 2 and m.batch_size == 64


def _solve(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error."""
    scale = 1.0 / targets
    coef, _ = nnls(features * scale[:, None], np.ones_like(targets))
    return coef


def _prefill_features(rows: Iterable[Measurement]) -> np.ndarray:
    return np.array([[1.0, r.batch_size * r.prompt_size, r.batch_size * r.prompt_size**2] for r in rows])


def _decode_features(rows: Iterable[Measurement]) -> np.ndarray:
    return np.array([[1.0, r.batch_size, r.mean_context_tokens] for r in rows])


def fit_phase(rows: list[Measurement]) -> PhaseFit:
    p = _solve(_prefill_features(rows), np.array([r.prompt_ms for r in rows]))
    d = _solve(_decode_features(rows), np.array([r.token_ms for r in rows]))
    return PhaseFit(*(float(c) for c in (*p, *d)))


def fit_perf_model(
    model: str = "llama2-70b", hardware: str = "h100-80gb", rows: list[Measurement] | None = None
) -> PerfModel:
    rows = load_measurements() if rows is None else rows
    fits = {}
    for tp in sorted({r.tp for r in rows if r.model == model and r.hardware == hardware}):
        fits[tp] = fit_phase([r for r in rows if r.model == model and r.hardware == hardware and r.tp == tp])
    if not fits:
        raise ValueError(f"no measurements for model={model!r} hardware={hardware!r}")
    return PerfModel(GPUS[hardware], MODELS[model], fits)


@lru_cache(maxsize=16)
def splitwise_perf_model(model: str, hardware: str) -> PerfModel:
    """Splitwise's 2023 fit (the `splitwise-*` profiles), fitted once per process."""
    return fit_perf_model(model, hardware)


def default_perf_model(model: str = "llama2-70b", hardware: str = "h100-80gb", profile: str | None = None) -> PerfModel:
    """The PerfModel of a named profile (energy.profiles.PROFILE_NAMES) sized as `model`, which
    must be for `hardware`. Without a name, the default for the pair: the current-stack
    (ML.ENERGY) profile where one covers it (energy.profiles.default_profile), else Splitwise's
    fit. Fitted once per process; the model is immutable so sharing it is safe."""
    # One cache key however the arguments are spelt: callers passing profile=None share the fit.
    return _perf_model(model, hardware, profile)


@lru_cache(maxsize=16)
def _perf_model(model: str, hardware: str, profile: str | None) -> PerfModel:
    from energy.profiles import PROFILES, default_profile, perf_model_for  # profiles build on the fits above

    profile = profile or default_profile(model, hardware)
    if profile is None:
        return splitwise_perf_model(model, hardware)
    perf = perf_model_for(profile, model)
    if PROFILES[profile].hardware != hardware:
        raise ValueError(f"perf profile {profile!r} is for {PROFILES[profile].hardware}, not {hardware}")
    return perf


@lru_cache(maxsize=1)
def _capped_rows() -> tuple[Measurement, ...]:
    return tuple(r for r in load_measurements() if r.model == "llama2-70b" and r.hardware == "h100-80gb-pcap")


def is_held_out(m: Measurement) -> bool:
    """Deterministic ~20% of distinct configurations (all their repeats go together,
    so a held-out row never has a twin in the training set)."""
    key = f"{m.model}/{m.hardware}/{m.tp}/{m.config_key}".encode()
    return hashlib.sha256(key).digest()[0] < 52


def mape_pct(pred: list[float], true: list[float]) -> float:
    p, t = np.asarray(pred), np.asarray(true)
    return float(np.mean(np.abs(p - t) / t) * 100)


@dataclass(frozen=True)
class HoldoutReport:
    model: str
    hardware: str
    train_rows: int
    test_rows: int
    prompt_mape_pct: float
    token_mape_pct: float


def holdout_report(model: str = "llama2-70b", hardware: str = "h100-80gb") -> HoldoutReport:
    rows = [r for r in load_measurements() if r.model == model and r.hardware == hardware]
    train = [r for r in rows if not is_held_out(r)]
    test = [r for r in rows if is_held_out(r)]
    pm = fit_perf_model(model, hardware, train)
    max_clock = pm.gpu.max_clock_mhz
    prompt_pred = [
        pm.prefill_time_s(r.batch_size * r.prompt_size, r.batch_size * r.prompt_size**2, r.tp, max_clock) * 1000
        for r in test
    ]
    token_pred = [pm.decode_time_s(r.batch_size, int(r.mean_context_tokens), r.tp, max_clock) * 1000 for r in test]
    return HoldoutReport(
        model, hardware, len(train), len(test),
        mape_pct(prompt_pred, [r.prompt_ms for r in test]), mape_pct(token_pred, [r.token_ms for r in test]),
    )


def power_cap_report(cap_w_per_gpu: float = 350.0, perf: PerfModel | None = None) -> tuple[float, float]:
    """Predict the power-capped H100 rows from the uncapped fit plus the power model.

    Splitwise caps each H100 at 50% (350 W). Returns (prompt MAPE %, token MAPE %).
    `perf`: Splitwise's Llama2-70B H100 fit on another GpuSpec (energy.clock_fit fits on this)."""
    pm = splitwise_perf_model("llama2-70b", "h100-80gb") if perf is None else perf
    capped = _capped_rows()
    prompt_clock = pm.clock_under_power_cap("prompt", cap_w_per_gpu)
    token_clock = pm.clock_under_power_cap("token", cap_w_per_gpu)
    prompt_pred = [
        pm.prefill_time_s(r.batch_size * r.prompt_size, r.batch_size * r.prompt_size**2, r.tp, prompt_clock) * 1000
        for r in capped
    ]
    token_pred = [pm.decode_time_s(r.batch_size, int(r.mean_context_tokens), r.tp, token_clock) * 1000 for r in capped]
    return mape_pct(prompt_pred, [r.prompt_ms for r in capped]), mape_pct(token_pred, [r.token_ms for r in capped])
