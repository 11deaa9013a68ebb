"""Fit perf/power profiles on ML.ENERGY Leaderboard measurements and report held-out error.

Source: energy/data/mlenergy_llama3.csv (provenance in energy/data/README.md): vLLM on H100
and B200 at the GPU's default clock, lm-arena-chat workload, one row per (model, GPU,
GPU count, max_num_seqs). What each part of a profile comes from:

- decode step, d0 + d1 * batch: fitted on median ITL vs average batch (NNLS, relative error).
- decode KV reads, d2: context grows with batch in these sweeps, so it cannot be fitted apart
  from d1; it is the datasheet cost of reading each context token's K and V once per step.
- decode power: a DecodePowerCurve fitted on average power per GPU vs the per-sequence share
  of the step, capped at TDP (GpuSpec.prompt_w).
- prefill: the export has no TTFT. Splitwise's Llama2-70B/H100 TP4 prefill fit keeps its shape
  and is scaled to the time the leaderboard's steps take beyond the median ITL (mean step =
  batch / throughput): the prefills of the requests that replace finished ones, for an
  assumed mean prompt of PROMPT_TOKENS. One scale per profile, fitted on all its rows. A 1k
  prompt then takes 39 ms (70B, 4xH100), 27 ms (70B, 2xB200), 12.5 ms (8B, H100): near or
  above dense BF16 peak, so part of each prompt likely came from the prefix cache. It is an
  effective figure for chat; for long prompts, treat per-token prefill as uncertain to ~2x.
- prefill power: GpuSpec.prompt_w (TDP), as in the Splitwise profile.
- clock: every row is at default (max boost) clock, so the DVFS part of PerfModel (GpuSpec's
  compute and core-power shares) is modelled, not measured, exactly as for Splitwise.
- other TPs: the leaderboard ran one TP per model and GPU. A source may name TPs it did not run
  (`extrapolated_tps`). There a decode step keeps the measured step's overhead (what is left of
  d0 once the weights are streamed) plus GpuSpec.tp_comm_ms_per_doubling per doubling, streams
  1/tp of the weights, and splits the per-sequence work tp ways; KV reads come from the
  datasheet. Both GPU constants are fitted on the leaderboard's own pairs of TPs for dense
  models on the same GPU (energy.tp_scaling). Prefill moves by Splitwise's measured ratios
  between the two TPs for Llama2-70B on the same GPU. The measured power curve moves by
  GpuSpec.tp_power_ratio_per_doubling (PerfModel.power_tp). DynamoLLM's TP8/TP4 energy
  (energy.model_check) checks these TPs; the leaderboard has no rows of them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from energy.calibration import mape_pct, splitwise_perf_model
from energy.hardware import GPUS, MODELS, ModelSpec
from energy.perf_model import PerfModel, PhaseFit
from energy.power_curve import DecodePowerCurve

MLENERGY_CSV = Path(__file__).parent / "data" / "mlenergy_llama3.csv"

# lm-arena-chat sends each turn with the conversation so far (ml-energy/benchmark's
# LMArenaHumanPreferenceDataset); the export gives no input lengths, so this is an
# assumption. It splits the measured prefill time into per-token cost (a shorter prompt
# would mean slower prefill per token) and sizes the KV cache.
PROMPT_TOKENS = 250

# The prefill shape every profile scales, and the TP ratios it extrapolates by: Splitwise's
# measured Llama2-70B sweeps.
_REFERENCE_MODEL, _PREFILL_REFERENCE_HARDWARE, _PREFILL_REFERENCE_TP = "llama2-70b", "h100-80gb", 4


@dataclass(frozen=True)
class LeaderboardRow:
    model_id: str
    gpu_model: str
    tp: int
    max_num_seqs: int
    batch: float  # average running batch
    output_tokens: float  # mean per request
    itl_ms: float  # median inter-token latency
    power_w: float  # average, all GPUs
    j_per_token: float
    tokens_per_s: float

    @property
    def context_tokens(self) -> float:
        """KV held by the batch: on average a sequence is through half its output."""
        return self.batch * (PROMPT_TOKENS + self.output_tokens / 2)

    @property
    def step_ms(self) -> float:
        """Mean time per step: the median ITL plus the prefills and stalls between tokens."""
        return self.batch / self.tokens_per_s * 1000

    @property
    def requests_per_step(self) -> float:
        """Requests finishing, and so admitted and prefilled, per decode step."""
        return self.batch / self.output_tokens

    def prefill_ms_per_step(self, prefill_ms: Callable[[float, float], float]) -> float:
        """Prefill time per step given `prefill_ms(tokens, sum of squared prompt lengths)`:
        once more than one request finishes per step, their prompts are prefilled together."""
        together = max(self.requests_per_step, 1.0)
        return prefill_ms(together * PROMPT_TOKENS, together * PROMPT_TOKENS**2) * self.requests_per_step / together


def load_rows(path: Path = MLENERGY_CSV) -> list[LeaderboardRow]:
    with open(path, newline="") as fh:
        return [
            LeaderboardRow(
                model_id=r["model_id"], gpu_model=r["gpu_model"], tp=int(r["tensor_parallel"]),
                max_num_seqs=int(r["max_num_seqs"]), batch=float(r["avg_batch_size"]),
                output_tokens=float(r["avg_output_len"]), itl_ms=float(r["median_itl_ms"]),
                power_w=float(r["avg_power_watts"]), j_per_token=float(r["energy_per_token_joules"]),
                tokens_per_s=float(r["output_throughput_tokens_per_sec"]),
            )
            for r in csv.DictReader(fh)
        ]


@dataclass(frozen=True)
class MlEnergySource:
    """Which leaderboard rows a profile is fitted on, and what it is sized as."""

    model_ids: tuple[str, ...]  # same-shape checkpoints pooled into one profile
    gpu_model: str  # as the leaderboard names it
    hardware: str  # key of energy.hardware.GPUS
    model: str  # key of energy.hardware.MODELS
    tp: int  # the one TP the leaderboard ran
    extrapolated_tps: tuple[int, ...] = ()  # fitted by Splitwise's TP ratios on `hardware`

    def rows(self) -> list[LeaderboardRow]:
        """Rows whose batch's KV cache fits the replica; beyond it vLLM must preempt, and the
        step no longer runs the batch it reports (B200 70B at 2048 seqs: ITL flat)."""
        capacity = MODELS[self.model].kv_capacity_tokens(GPUS[self.hardware], self.tp)
        return [
            r for r in load_rows()
            if r.model_id in self.model_ids and r.gpu_model == self.gpu_model and r.tp == self.tp
            and r.context_tokens <= capacity
        ]


def kv_read_ms_per_token(model: ModelSpec, hardware: str, tp: int) -> float:
    """Time to stream one context token's K and V from HBM, split over `tp` GPUs."""
    bandwidth = GPUS[hardware].hbm_tb_per_s
    if bandwidth is None:
        raise ValueError(f"{hardware}: no HBM bandwidth to cost KV reads with")
    return model.kv_bytes_per_token / (tp * bandwidth * 1e12) * 1000


def _reference_prefill() -> PhaseFit:
    return splitwise_perf_model(_REFERENCE_MODEL, _PREFILL_REFERENCE_HARDWARE).fits[_PREFILL_REFERENCE_TP]


def _moved_to_tp(fit: PhaseFit, perf: PerfModel, measured_tp: int, tp: int) -> PhaseFit:
    """`fit` (measured at `measured_tp`) moved to `tp`: decode by the GPU's TP law, prefill by
    Splitwise's measured Llama2-70B ratios on the same GPU."""
    fits = splitwise_perf_model(_REFERENCE_MODEL, perf.gpu.name).fits
    if measured_tp not in fits or tp not in fits:
        raise ValueError(f"Splitwise measured Llama2-70B on {perf.gpu.name} at TP{list(fits)}: "
                         f"cannot extrapolate TP{measured_tp} to TP{tp}")
    at, base = fits[tp], fits[measured_tp]
    overhead = perf.overhead_ms(measured_tp) + perf.gpu.tp_comm_ms_per_doubling * math.log2(tp / measured_tp)
    return PhaseFit(fit.p0 * at.p0 / base.p0, fit.p1 * at.p1 / base.p1, fit.p2 * at.p2 / base.p2,
                    max(overhead, 0.0) + perf.weight_read_ms(tp), fit.d1 * measured_tp / tp,
                    kv_read_ms_per_token(perf.model, perf.gpu.name, tp))


def _prefill_scale(rows: list[LeaderboardRow], reference: PhaseFit) -> float:
    """Least-squares scale (relative to the mean step) of the reference prefill that fills
    the gap between the mean step and the median ITL."""
    per_step = np.array([r.prefill_ms_per_step(lambda n, sq: reference.p0 + reference.p1 * n + reference.p2 * sq)
                         for r in rows])
    step = np.array([r.step_ms for r in rows])
    gap = step - np.array([r.itl_ms for r in rows])
    return max(float(np.sum(per_step * gap / step**2) / np.sum(per_step**2 / step**2)), 0.0)


def fit_profile(source: MlEnergySource, rows: list[LeaderboardRow], model: str | None = None) -> PerfModel:
    """A PerfModel for `source`, fitted on `rows` (a subset of source.rows())."""
    spec = MODELS[model or source.model]
    gpu = GPUS[source.hardware]
    d2 = kv_read_ms_per_token(spec, source.hardware, source.tp)
    itl = np.array([r.itl_ms for r in rows])
    kv_ms = np.array([d2 * r.context_tokens for r in rows])
    batch = np.array([r.batch for r in rows])
    # Non-negative least squares on relative error, as for the Splitwise fits.
    (d0, d1), _ = nnls(np.c_[np.ones_like(batch), batch] / itl[:, None], (itl - kv_ms) / itl)
    per_seq_ms = d1 * batch + kv_ms
    share = per_seq_ms / (d0 + per_seq_ms)
    gpu_w = np.array([r.power_w / r.tp for r in rows])
    (base_w, per_seq_w), _ = nnls(np.c_[np.ones_like(share), share] / gpu_w[:, None], np.ones_like(gpu_w))
    ref = _reference_prefill()
    scale = _prefill_scale(rows, ref)
    fit = PhaseFit(ref.p0 * scale, ref.p1 * scale, ref.p2 * scale, float(d0), float(d1), d2)
    curve = DecodePowerCurve(float(base_w), float(per_seq_w), gpu.prompt_w)
    measured = PerfModel(gpu, spec, {source.tp: fit}, curve, power_tp=source.tp)
    fits = {source.tp: fit} | {tp: _moved_to_tp(fit, measured, source.tp, tp) for tp in source.extrapolated_tps}
    return PerfModel(gpu, spec, fits, curve, power_tp=source.tp)


@dataclass(frozen=True)
class RowPrediction:
    row: LeaderboardRow
    itl_ms: float
    power_w: float  # all GPUs
    j_per_token: float

    def error_pct(self, field: str) -> float:
        return (getattr(self, field) / getattr(self.row, field) - 1) * 100


def predict(perf: PerfModel, row: LeaderboardRow) -> RowPrediction:
    """The leaderboard's steady state from the profile, at max clock: each step decodes the
    batch, and the requests that finished are replaced, prefilled together once more than
    one finishes per step. The power curve was fitted on run averages that include prefill
    chunks, so it is charged for the whole step."""
    clock = perf.gpu.max_clock_mhz
    decode_s = perf.decode_time_s(row.batch, row.context_tokens, row.tp, clock)
    step_s = decode_s + row.prefill_ms_per_step(
        lambda n, sq: perf.prefill_time_s(round(n), sq, row.tp, clock) * 1000) / 1000
    power_w = perf.decode_power_w(row.batch, row.context_tokens, row.tp, clock) * row.tp
    return RowPrediction(row, decode_s * 1000, power_w, power_w * step_s / row.batch)


def every_other_batch(rows: list[LeaderboardRow]) -> list[LeaderboardRow]:
    """Held out: the 2nd, 4th, ... max_num_seqs of each checkpoint (whole configurations)."""
    held = []
    for model_id in sorted({r.model_id for r in rows}):
        sweep = sorted((r for r in rows if r.model_id == model_id), key=lambda r: r.max_num_seqs)
        held += sweep[1::2]
    return held


def later_checkpoint(rows: list[LeaderboardRow]) -> list[LeaderboardRow]:
    """Held out: every row of the last-named checkpoint (Llama-3.3-70B when fitted on 3.1)."""
    last = max(r.model_id for r in rows)
    return [r for r in rows if r.model_id == last]


@dataclass(frozen=True)
class Holdout:
    profile: str
    split: str
    train_rows: int
    predictions: tuple[RowPrediction, ...]

    def mape_pct(self, field: str) -> float:
        predicted = [getattr(p, field) for p in self.predictions]
        return mape_pct(predicted, [getattr(p.row, field) for p in self.predictions])

    def max_error_pct(self, field: str) -> float:
        return max(abs(p.error_pct(field)) for p in self.predictions)


def holdout(
    profile: str, source: MlEnergySource, split: Callable[[list[LeaderboardRow]], list[LeaderboardRow]]
) -> Holdout:
    """Fit on the rows `split` leaves in, predict the ones it holds out."""
    rows = source.rows()
    test = split(rows)
    train = [r for r in rows if r not in test]
    perf = fit_profile(source, train)
    return Holdout(profile, split.__name__.replace("_", " "), len(train), tuple(predict(perf, r) for r in test))


def holdouts(sources: dict[str, MlEnergySource]) -> list[Holdout]:
    """Every profile with every other batch size held out; pooled checkpoints also with the
    later one held out whole (does one fit serve both?)."""
    out = []
    for name, source in sources.items():
        out.append(holdout(name, source, every_other_batch))
        if len(source.model_ids) > 1:
            out.append(holdout(name, source, later_checkpoint))
    return out
