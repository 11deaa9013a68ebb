"""The perf/power model beside the measurements it must reproduce.

DynamoLLM Tables I-III (energy.dynamollm_tables): one instance of each TP at each clock carries
the row's load on an 8-GPU server; the model's cell is the server's GPU power (its energy over
the tables' fixed duration): the instance's from the fluid CapacityModel the planners use, plus
the GPUs the instance leaves unused, blank where it misses the class's TTFT or TBT target. Only
ratios within a row are compared. DynamoLLM measured vLLM of
2024, the stack Splitwise measured latencies on (same group, model and DGX-H100): its steps
carried 10-19 ms more CPU and launch overhead than today's vLLM (Splitwise's Llama2-70B decode
step minus the default profile's, per TP). `dynamollm_stack` adds that measured overhead to a
profile, at floor power, so the tables are read on the stack that produced them.

throttLL'eM's A100 sweet spot (its Fig. 2e): Llama2-13B at TP2, a fixed batch of 32 requests
of 1 input and 1,024 output tokens; tokens per joule peak at 1,050 of 1,410 MHz.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import spearmanr

from core.classes import LengthClassConfig
from energy.calibration import splitwise_perf_model
from energy.capacity import CapacityModel
from energy.dynamollm_tables import CLOCKS_GHZ, TENSOR_PARALLEL, MeasuredRow
from energy.hardware import GPUS, MODELS
from energy.perf_model import PerfModel, PhaseFit
from energy.profile import CONV_CLASS_SHAPES
from energy.profile_builder import steady_state_measure

# Table IV's SLOs; the rows' class shapes are the conversation trace's means per class.
LENGTHS = LengthClassConfig()
ARGMIN_TOLERANCE = 1.03  # the measured argmin may cost this much more than the model's least
# The rows the targets count (Table II's medium row is Table I's MM).
TARGET_ROWS = ("I", "II")


def clock_mhz(perf: PerfModel, ghz: str) -> float:
    """The tables' 2.0 GHz is the GPU's top clock (1,980 MHz on H100)."""
    return min(float(ghz) * 1000, float(perf.gpu.max_clock_mhz))


def dynamollm_stack(perf: PerfModel) -> PerfModel:
    """`perf` with the extra per-step overhead of the 2024 vLLM stack DynamoLLM measured on:
    Splitwise's measured Llama2-70B step minus this profile's, per TP, on each step."""
    reference = splitwise_perf_model("llama2-70b", perf.gpu.name).fits
    fits = {}
    for tp, f in perf.fits.items():
        extra_ms = max(reference[tp].d0 - f.d0, 0.0) if tp in reference else 0.0
        fits[tp] = replace(f, p0=f.p0 + extra_ms, d0=f.d0 + extra_ms)
    # PerfModel reads the extra time as overhead: d0 grew, the weight read did not.
    return PerfModel(perf.gpu, perf.model, fits, perf.decode_power, perf.power_tp)


# DynamoLLM reports "the energy consumed by the GPUs" of one DGX-H100: a TP2 or TP4 instance
# leaves 6 or 4 GPUs idle with no model loaded, which its §III measured at 550 W for all 8.
SERVER_GPUS = 8
UNUSED_GPU_W = 550 / SERVER_GPUS


def server_cells(perf: PerfModel, row: MeasuredRow) -> np.ndarray:
    """Mean GPU power (W) of the server per (TP, clock) cell, one instance carrying the row's
    load; nan where the model says it misses the class's SLO (or the profile has no such TP)."""
    prompt, output = CONV_CLASS_SHAPES[row.length_class]
    rate = row.rate_per_s(prompt, output)
    slo = LENGTHS.slo(row.length_class)
    cap = CapacityModel(perf)
    out = np.full((len(TENSOR_PARALLEL), len(CLOCKS_GHZ)), np.nan)
    for i, tp in enumerate(TENSOR_PARALLEL):
        if tp not in perf.fits:
            continue
        for j, ghz in enumerate(CLOCKS_GHZ):
            value = steady_state_measure(cap, (prompt, output), tp, clock_mhz(perf, ghz), slo.tbt_s)(rate)
            if value is not None and value[1] <= slo.ttft_s:
                out[i, j] = value[0] + (SERVER_GPUS - tp) * UNUSED_GPU_W
    return out


def _cell(grid: np.ndarray, index: int) -> tuple[int, str]:
    i, j = divmod(index, len(CLOCKS_GHZ))
    return TENSOR_PARALLEL[i], CLOCKS_GHZ[j]


@dataclass(frozen=True)
class RowCheck:
    """One measured row beside the model, on the cells both have."""

    row: MeasuredRow
    model: np.ndarray  # W per cell, nan where the model misses the SLO

    @property
    def both(self) -> np.ndarray:
        return ~np.isnan(self.row.energy_wh) & ~np.isnan(self.model)

    @property
    def measured_argmin(self) -> tuple[int, str]:
        return _cell(self.row.energy_wh, int(np.nanargmin(self.row.energy_wh)))

    @property
    def model_argmin(self) -> tuple[int, str] | None:
        if not self.both.any():
            return None
        return _cell(self.model, int(np.nanargmin(np.where(self.both, self.model, np.nan))))

    @property
    def argmin_cost(self) -> float:
        """The model's energy at the measured argmin over its least (on shared cells); inf
        where the model has no value at the measured argmin."""
        index = int(np.nanargmin(self.row.energy_wh))
        if not self.both.flat[index]:
            return float("inf")
        return float(self.model.flat[index] / np.nanmin(np.where(self.both, self.model, np.nan)))

    @property
    def argmin_ok(self) -> bool:
        return self.model_argmin == self.measured_argmin or self.argmin_cost <= ARGMIN_TOLERANCE

    def _low_clock_tp(self) -> int | None:
        """The smallest TP whose row measured both 0.8 and 1.2 GHz."""
        for i in range(len(TENSOR_PARALLEL)):
            if not np.isnan(self.row.energy_wh[i, :2]).any():
                return i
        return None

    @property
    def low_clock_ratio(self) -> tuple[float, float] | None:
        """E(0.8 GHz) / E(1.2 GHz), measured and modelled (nan where the model misses one)."""
        i = self._low_clock_tp()
        if i is None:
            return None
        measured = self.row.energy_wh[i]
        return float(measured[0] / measured[1]), float(self.model[i, 0] / self.model[i, 1])

    @property
    def low_clock_tp(self) -> int | None:
        i = self._low_clock_tp()
        return None if i is None else TENSOR_PARALLEL[i]

    @property
    def tp8_over_tp4(self) -> tuple[float, float] | None:
        """E(TP8) / E(TP4) at 2.0 GHz (max clock), measured and modelled."""
        top = len(CLOCKS_GHZ) - 1
        four, eight = TENSOR_PARALLEL.index(4), TENSOR_PARALLEL.index(8)
        measured = self.row.energy_wh
        if np.isnan(measured[four, top]) or np.isnan(measured[eight, top]):
            return None
        return float(measured[eight, top] / measured[four, top]), float(self.model[eight, top] / self.model[four, top])

    @property
    def spearman(self) -> float:
        both = self.both
        if both.sum() < 3:
            return float("nan")
        return float(spearmanr(self.row.energy_wh[both], self.model[both]).statistic)

    @property
    def shape_error(self) -> float:
        """RMS of log(model / measured) over the shared cells, each side's mean removed."""
        both = self.both
        if both.sum() < 2:
            return float("nan")
        diff = np.log(self.model[both]) - np.log(self.row.energy_wh[both])
        return float(np.sqrt(np.mean((diff - diff.mean()) ** 2)))


def check_rows(perf_for: dict[str, PerfModel], rows: list[MeasuredRow]) -> list[RowCheck]:
    """Each row beside the model; `perf_for` maps a row's model to the PerfModel sizing it
    (rows of other models are left out)."""
    return [RowCheck(r, server_cells(perf_for[r.model], r)) for r in rows if r.model in perf_for]


@dataclass(frozen=True)
class Targets:
    """The issue's targets over the rows the targets count (Tables I and II)."""

    argmin_rows: int
    rows: int
    low_clock_within: int  # rows whose E(0.8)/E(1.2) is within LOW_CLOCK_TOLERANCE
    low_clock_rows: int
    tp_within: int  # rows whose E(TP8)/E(TP4) is within TP_TOLERANCE
    tp_rows: int


LOW_CLOCK_TOLERANCE = 0.06
TP_TOLERANCE = 0.15


def counted(checks: list[RowCheck]) -> list[RowCheck]:
    """The rows the targets count: Tables I and II, Table II's medium row being Table I's MM."""
    return [c for c in checks if c.row.table in TARGET_ROWS and not (c.row.table == "II" and c.row.name == "medium")]


def targets(checks: list[RowCheck]) -> Targets:
    counted_rows = counted(checks)
    low = [c.low_clock_ratio for c in counted_rows if c.low_clock_ratio is not None]
    tp = [c.tp8_over_tp4 for c in counted_rows if c.tp8_over_tp4 is not None]
    return Targets(
        argmin_rows=sum(c.argmin_ok for c in counted_rows), rows=len(counted_rows),
        low_clock_within=sum(abs(m - o) <= LOW_CLOCK_TOLERANCE for m, o in low), low_clock_rows=len(low),
        tp_within=sum(abs(o / m - 1) <= TP_TOLERANCE for m, o in tp), tp_rows=len(tp),
    )


# --- throttLL'eM's A100 sweet spot -----------------------------------------------------------

THROTTLLEM_BATCH = 32
THROTTLLEM_OUTPUT_TOKENS = 1024
THROTTLLEM_SWEET_SPOT_MHZ = 1050
THROTTLLEM_TBT_STRETCH = 1.0541  # TBT at 1,050 MHz over 1,410 (+5.41%)
THROTTLLEM_EFFICIENCY_GAIN = 1.374  # tokens/J at 1,050 MHz over 1,410 (+37.4%)


def throttllem_engine(gpu_name: str = "a100-80gb") -> PerfModel:
    """Llama2-13B at TP2 on the A100, decode step from first principles: the GPU's overhead,
    the weight read at its sustained bandwidth, per-sequence compute at half the tensor-core
    peak, KV reads from the datasheet (TensorRT-LLM: a lean stack, no measured profile)."""
    gpu = GPUS[gpu_name]
    model = MODELS["llama2-13b"]
    tp = 2
    if gpu.hbm_tb_per_s is None or gpu.peak_tflops is None:
        raise ValueError(f"{gpu_name}: no datasheet bandwidth and peak to cost a step from")
    bandwidth = gpu.hbm_tb_per_s
    weights_ms = model.weight_bytes / tp / (bandwidth * 1e12 * gpu.hbm_efficiency) * 1000
    per_seq_ms = 2 * model.params_b * 1e9 / tp / (gpu.peak_tflops * 1e12 * 0.5) * 1000
    kv_ms = model.kv_bytes_per_token / tp / (bandwidth * 1e12) * 1000
    overhead_ms = gpu.tp_comm_ms_per_doubling
    fit = PhaseFit(0.0, 0.0, 0.0, overhead_ms + weights_ms, per_seq_ms, kv_ms)
    return PerfModel(gpu, model, {tp: fit}, power_tp=tp)


def tokens_per_joule(perf: PerfModel, clock: float) -> float:
    tp = perf.tensor_parallel_degrees[0]
    context = THROTTLLEM_BATCH * (1 + THROTTLLEM_OUTPUT_TOKENS / 2)
    step = perf.iteration(0, 0.0, THROTTLLEM_BATCH, int(context), tp, clock)
    return THROTTLLEM_BATCH / step.energy_j


@dataclass(frozen=True)
class SweetSpot:
    clock_mhz: float  # where tokens/J peak
    efficiency_gain: float  # tokens/J at 1,050 MHz over max clock
    tbt_stretch: float  # decode step at 1,050 MHz over max clock


def sweet_spot(perf: PerfModel) -> SweetSpot:
    clocks = perf.gpu.supported_clocks_mhz()
    efficiency = [tokens_per_joule(perf, c) for c in clocks]
    top = perf.gpu.max_clock_mhz
    tp = perf.tensor_parallel_degrees[0]
    context = THROTTLLEM_BATCH * (1 + THROTTLLEM_OUTPUT_TOKENS / 2)
    stretch = (perf.decode_time_s(THROTTLLEM_BATCH, context, tp, THROTTLLEM_SWEET_SPOT_MHZ)
               / perf.decode_time_s(THROTTLLEM_BATCH, context, tp, top))
    return SweetSpot(float(clocks[int(np.argmax(efficiency))]),
                     tokens_per_joule(perf, THROTTLLEM_SWEET_SPOT_MHZ) / tokens_per_joule(perf, top), stretch)
