"""Summarise a run: energy, GPU-hours, cost, carbon, latency percentiles, SLO attainment.

TBT is judged per request by its mean gap between tokens (the ITL a client sees on
average, as Chiron and throttLL'eM do); the worst gap is reported beside it
(`p99_max_tbt_s`), since chunked prefill makes single gaps spiky. A request meets its
SLO when it completed, its TTFT is within its target and its mean TBT too.
Splitwise's SLOs (Table VI) are slowdown percentiles instead: `slowdown_percentiles`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.efficiency import joules_per_generated_token
from energy.hardware import GPUS
from energy.perf_model import PerfModel
from sim.config import SimConfig
from sim.records import CLASS_NAMES, RequestLog
from sim.simulator import RawRun

J_PER_KWH = 3.6e6
PERCENTILES = (50, 90, 99)


def _pct(values: np.ndarray) -> dict[str, float | None]:
    v = values[~np.isnan(values)]
    return {f"p{p}": (float(np.percentile(v, p)) if len(v) else None) for p in PERCENTILES}


def slo_met(log: RequestLog) -> np.ndarray:
    return log.done & (log.ttft_s <= log.slo_ttft_s) & (log.mean_tbt_s <= log.slo_tbt_s)


def attainment_by_class(log: RequestLog, met: np.ndarray | None = None) -> dict[str, float]:
    """Share of each length class's requests that met their SLO (classes with requests only)."""
    met = slo_met(log) if met is None else met
    return {c: float(met[log.length_class == i].mean()) for i, c in enumerate(CLASS_NAMES)
            if (log.length_class == i).any()}


def e2e_deadline_met(log: RequestLog) -> np.ndarray:
    """Completed by its end-to-end deadline (`SLO.e2e_for`: TTFT plus one TBT per further token
    unless the SLO names one): throttLL'eM's measure, looser than `slo_met` (a late first token
    may be made up by faster ones)."""
    return log.done & (log.e2e_s <= log.slo_e2e_s)


def _group(log: RequestLog, mask: np.ndarray, met: np.ndarray) -> dict[str, Any]:
    n = int(mask.sum())
    return {
        "requests": n,
        "completed": int((log.done & mask).sum()),
        "slo_attainment": float(met[mask].mean()) if n else None,
        "ttft_s": _pct(log.ttft_s[mask]),
        "mean_tbt_s": _pct(log.mean_tbt_s[mask]),
        "max_tbt_s": _pct(log.max_tbt_s[mask]),
        "e2e_s": _pct(log.e2e_s[mask]),
        "energy_j": float(log.energy_j[mask].sum()),
    }


def worst_class(summary: dict[str, Any]) -> tuple[str, float]:
    """The length class with the lowest SLO attainment in a `summarise` report, and that share."""
    classes = {k: v for k, v in summary["slo_attainment"].items() if k in CLASS_NAMES}
    name = min(classes, key=classes.__getitem__)
    return name, classes[name]


def carbon_g(series_t_s: np.ndarray, series_energy_j: np.ndarray, intensity_g_per_kwh: float | np.ndarray) -> float:
    """gCO2 of the energy drawn in each sample interval at that interval's grid intensity."""
    energy = np.diff(np.concatenate([[0.0], series_energy_j]))
    intensity = np.broadcast_to(np.asarray(intensity_g_per_kwh, dtype=float), energy.shape)
    return float((energy / J_PER_KWH * intensity).sum())


def summarise(raw: RawRun, config: SimConfig, carbon_series: np.ndarray | None = None) -> dict[str, Any]:
    """The run's report; `carbon_series` gives the grid intensity per sample (else constant)."""
    log = raw.log
    met = slo_met(log)
    energy = float(raw.series.energy_j[-1])
    gpu_s = sum(r.held_s(raw.end_s) * r.tp for r in raw.replicas)
    price = config.price_per_gpu_hour if config.price_per_gpu_hour is not None else GPUS[config.hardware].price_per_hour
    generated = int(log.output_tokens[log.done].sum())
    intensity = config.grid_gco2_per_kwh if carbon_series is None else carbon_series
    everyone = np.ones(len(log), dtype=bool)
    overall = _group(log, everyone, met)
    return {
        "requests": len(log),
        "completed": int(log.done.sum()),
        "rejected": int(log.rejected.sum()),
        "duration_s": raw.end_s,
        "energy_j": energy,
        "energy_kwh": energy / J_PER_KWH,
        "j_per_token": joules_per_generated_token(energy, generated),
        "gpu_hours": gpu_s / 3600.0,
        "cost_usd": gpu_s / 3600.0 * price,
        "carbon_g": carbon_g(np.asarray(raw.series.t_s), np.asarray(raw.series.energy_j), intensity),
        "slo_attainment": {
            "overall": overall["slo_attainment"],
            **attainment_by_class(log, met),
            **{s: float(met[log.interactive == flag].mean()) for s, flag in (("interactive", True), ("batch", False))
               if (log.interactive == flag).any()},
        },
        "e2e_deadline_attainment": float(e2e_deadline_met(log).mean()) if len(log) else None,
        "goodput_rps": float(met.sum()) / max(raw.end_s, 1e-9),
        "p50_ttft_s": overall["ttft_s"]["p50"],
        "p99_ttft_s": overall["ttft_s"]["p99"],
        "p50_tbt_s": overall["mean_tbt_s"]["p50"],
        "p99_tbt_s": overall["mean_tbt_s"]["p99"],
        "p99_max_tbt_s": overall["max_tbt_s"]["p99"],
        "p99_e2e_s": overall["e2e_s"]["p99"],
        "preemptions": int(log.preemptions.sum()),
        # Prefix caching (workloads with prefix hashes): share of completed prompts' tokens found
        # cached, and the prompt tokens computed.
        "prefix_hit_rate": float(log.cached_tokens[log.done].sum() / max(log.prompt_tokens[log.done].sum(), 1)),
        "prefill_tokens_computed": int((log.prompt_tokens - log.cached_tokens)[log.done].sum()),
        "peak_gpus": int(max(raw.series.gpus)),
        "slo_guard_s": dict(raw.slo_guard_s),
        "by_length_class": {c: _group(log, log.length_class == i, met) for i, c in enumerate(CLASS_NAMES)
                            if (log.length_class == i).any()},
        "by_service_class": {s: _group(log, log.interactive == flag, met)
                             for s, flag in (("interactive", True), ("batch", False))
                             if (log.interactive == flag).any()},
    }


# ---- Splitwise Table VI: latency as slowdown vs the same request alone on a reference machine ----
NEVER_DONE_SLOWDOWN = 1e9  # a request that did not complete fails every slowdown limit


def unloaded_latencies_s(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, reference: PerfModel, tp: int = 8,
) -> dict[str, np.ndarray]:
    """TTFT, mean TBT and E2E of each request run alone (batch 1, max clock) on `reference`.

    Decode time is linear in context, so the mean TBT is the step at the mean context
    (prompt + half the output)."""
    p = prompt_tokens.astype(float)
    out = output_tokens.astype(float)
    clock = reference.gpu.max_clock_mhz
    ttft = reference.prefill_time_s(p, p**2, tp, clock)
    tbt = reference.decode_time_s(1, p + out / 2, tp, clock)
    return {"ttft": ttft, "tbt": tbt, "e2e": ttft + np.maximum(out - 1, 0) * tbt}


def slowdown_percentiles(
    log: RequestLog, target_output_tokens: np.ndarray, reference: PerfModel, tp: int = 8,
) -> dict[str, dict[int, float]]:
    """P50/P90/P99 of per-request slowdowns of TTFT, TBT (requests with > 1 token) and E2E.

    `target_output_tokens` are the workload's lengths (the log holds only completed
    ones); unfinished requests count as NEVER_DONE_SLOWDOWN."""
    base = unloaded_latencies_s(log.prompt_tokens, target_output_tokens, reference, tp)
    observed = {"ttft": log.ttft_s, "tbt": log.mean_tbt_s, "e2e": log.e2e_s}
    out: dict[str, dict[int, float]] = {}
    for metric, seen in observed.items():
        ratio = np.where(log.done, seen / base[metric], NEVER_DONE_SLOWDOWN)
        if metric == "tbt":
            ratio = ratio[target_output_tokens > 1]
        out[metric] = {q: (float(np.percentile(ratio, q, method="higher")) if len(ratio) else 0.0)
                       for q in PERCENTILES}
    return out
