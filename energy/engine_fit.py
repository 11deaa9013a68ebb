"""Fit the performance model on latencies measured on a real engine.

DynamoLLM plans with a profile built from a PerfModel; by default that model is fitted
on Splitwise's published sweeps of Llama-2-70B / BLOOM. `wattwise profile --vllm-model`
measures the same two curves on the engine a user actually serves (prefill time vs
batch x context, decode step vs batch and context), so fitting them with the same
features (energy.calibration) gives a PerfModel, and from it a profile, for that model
on that machine. Latency is measured; power still comes from the GPU's power model
(energy.hardware), since a CPU backend has no NVML to measure it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from energy.calibration import Measurement, fit_phase, mape_pct
from energy.hardware import GpuSpec, ModelSpec
from energy.latency_points import LatencyPoint
from energy.perf_model import PerfModel


def as_measurement(point: LatencyPoint, model: str, hardware: str) -> Measurement:
    """A batch arriving together: its mean TTFT is the prefill of batch x context tokens
    (one step while they fit max_num_batched_tokens), its ITL the decode step at that batch."""
    return Measurement(
        model=model, hardware=hardware, tp=point.tensor_parallel, prompt_size=point.context_tokens,
        batch_size=point.batch, token_size=point.output_tokens,
        prompt_ms=point.ttft_s * 1000, token_ms=point.itl_s * 1000,
    )


@dataclass(frozen=True)
class FitQuality:
    """In-sample mean absolute percentage error of the fit, per TP."""

    tp: int
    points: int
    prompt_mape_pct: float
    token_mape_pct: float


def one_step(batch: int, context_tokens: int, step_tokens: int | None) -> bool:
    """Whether `batch` prompts of `context_tokens` fit one engine step of `step_tokens`
    (vLLM's max_num_batched_tokens; None: assume they do). A batch that does not is
    prefilled in chunks over several steps, in which the first requests already decode: its
    mean TTFT is not one prefill step's time, nor its ITL a decode step's."""
    return step_tokens is None or batch * context_tokens <= step_tokens


def fittable(point: LatencyPoint, step_tokens: int | None) -> bool:
    """A measured point the fit may use: both latencies seen, its prompts in one step."""
    return point.itl_s > 0 and point.ttft_s > 0 and one_step(point.batch, point.context_tokens, step_tokens)


def prefill_points(points: list[LatencyPoint], batch_one: bool) -> list[LatencyPoint]:
    """The points prefill is fitted on: all, or with `batch_one` those of one request. The
    requests of a larger batch reach a running engine over more than one step (the first
    starts a step alone), so their mean TTFT is not one step prefilling batch x context."""
    return [p for p in points if p.batch == 1] if batch_one else points


def fit_engine_perf_model(points: list[LatencyPoint], model: ModelSpec, gpu: GpuSpec,
                          step_tokens: int | None = None, prefill_batch_one: bool = False) -> PerfModel:
    """One PhaseFit per TP measured, on the points whose prompts fit one step of
    `step_tokens` (one_step), prefill on prefill_points of them; at least three per TP
    and phase, since each phase has three coefficients."""
    by_tp: dict[int, list[LatencyPoint]] = defaultdict(list)
    for p in points:
        if fittable(p, step_tokens):
            by_tp[p.tensor_parallel].append(p)
    short = {tp: len(ps) for tp, ps in by_tp.items()
             if len(ps) < 3 or len(prefill_points(ps, prefill_batch_one)) < 3}
    if not by_tp or short:
        raise ValueError(f"need >= 3 measured (batch, context) points per TP and phase, prompts in one step, to "
                         f"fit{' (prefill: batch 1)' if prefill_batch_one else ''}; have {dict(short) or 'none'}")
    fits = {}
    for tp, ps in by_tp.items():
        decode = fit_phase([as_measurement(p, model.name, gpu.name) for p in ps])
        prefill = fit_phase([as_measurement(p, model.name, gpu.name) for p in prefill_points(ps, prefill_batch_one)])
        fits[tp] = replace(decode, p0=prefill.p0, p1=prefill.p1, p2=prefill.p2)
    return PerfModel(gpu, model, fits)


def fit_quality(perf: PerfModel, points: list[LatencyPoint], step_tokens: int | None = None,
                prefill_batch_one: bool = False) -> list[FitQuality]:
    """How well the fitted model reproduces the points it was fitted on (at max clock)."""
    clock = perf.gpu.max_clock_mhz
    out = []
    for tp in perf.tensor_parallel_degrees:
        used = [p for p in points if p.tensor_parallel == tp and fittable(p, step_tokens)]
        rows = [as_measurement(p, perf.model.name, perf.gpu.name) for p in used]
        prompt_rows = [as_measurement(p, perf.model.name, perf.gpu.name)
                       for p in prefill_points(used, prefill_batch_one)]
        prompt = [perf.prefill_time_s(r.batch_size * r.prompt_size, r.batch_size * r.prompt_size**2, tp, clock)
                  * 1000 for r in prompt_rows]
        token = [perf.decode_time_s(r.batch_size, r.mean_context_tokens, tp, clock) * 1000 for r in rows]
        out.append(FitQuality(tp, len(rows), mape_pct(prompt, [r.prompt_ms for r in prompt_rows]),
                              mape_pct(token, [r.token_ms for r in rows])))
    return out
